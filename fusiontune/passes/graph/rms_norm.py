"""RmsNormFusionPass: decomposed mean-of-squares normalization -> RMSNorm."""

from __future__ import annotations

import numpy as np

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, op_attrs
from fusiontune.passes.pattern import C, Match, P, Rule, V, apply_rules, last_axis
from fusiontune.passes.pipeline import patterns

_x = V("x")
# The canonical form (canonicalize stage): a square is Mul(x, x); x * Rsqrt(v) is x / Sqrt(v).
NORMALIZED = P("Div", _x, P("Sqrt", P("Add", P("ReduceMean", P("Mul", _x, _x), where=last_axis), C("eps"))))
"""``x / Sqrt(ReduceMean(x * x, -1) + eps)``: the RMS normalization before its scale."""


def build_rms_norm(m: Match) -> Fusion | None:
    """The RMSNorm node for a match of ``NORMALIZED`` (scaled by ``gamma`` when it is bound)."""
    x, gamma = m["x"], m.get("gamma")
    n = m.view.shape(x)[-1]
    if gamma is not None and not m.view.is_param(gamma, n):
        return None
    root = m.nodes[0]
    inputs = (x, gamma if gamma is not None else np.ones(n, dtype=m.view.dtype(x)))
    attrs = op_attrs("RMSNorm", eps=m.scalar("eps"))
    return Fusion("RmsNormMulSqrt", m.nodes, "RMSNorm", inputs, root.outputs, attrs)


RULES = (
    Rule("RmsNormMulSqrt", P("Mul", NORMALIZED, V("gamma")), build_rms_norm),
    Rule("RmsNormMulSqrt", NORMALIZED, build_rms_norm),
)


@patterns("RmsNormMulSqrt")
def rms_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold a decomposed RMS normalization over the last axis into one RMSNorm node.

    Identity: ``x / Sqrt(ReduceMean(x * x, -1) + eps) * gamma == RMSNorm(x, gamma, eps)``. The
    canonicalize stage brings the other spellings exporters write to this one first
    (``Pow(x, 2)``, ``x * Rsqrt(.)``, ``x * Reciprocal(Sqrt(.))``, ``x * Div(1, Sqrt(.))``,
    commuted operands, no-op casts). Without the scale gamma is a new constant of ones.

    Preconditions: the mean runs over the last axis with keepdims; eps is a scalar constant;
    gamma is a constant or graph input of shape ``(N,)``; the square, the mean and every later
    intermediate are read inside the pattern only and are no graph outputs.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
