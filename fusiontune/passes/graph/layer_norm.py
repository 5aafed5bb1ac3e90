"""LayerNormFusionPass: decomposed mean/variance normalization -> LayerNorm."""

from __future__ import annotations

import numpy as np

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, op_attrs
from fusiontune.passes.pattern import C, Match, P, Rule, V, apply_rules, last_axis
from fusiontune.passes.pipeline import patterns

_x = V("x")
# d = x - mean, as one Sub node or (torch code that writes ``x - u`` twice) several.
_D = P("Sub", _x, P("ReduceMean", _x, name="mean", where=last_axis))
_VAR = P("ReduceMean", P("Mul", _D, _D), where=last_axis)
# The canonical form (canonicalize stage): a square is Mul(d, d); d * Rsqrt(v) is d / Sqrt(v).
NORMALIZED = P("Div", _D, P("Sqrt", P("Add", _VAR, C("eps"))))
"""``d / Sqrt(ReduceMean(d * d, -1) + eps)`` with ``d = x - ReduceMean(x, -1)``."""


def build_layer_norm(m: Match) -> Fusion | None:
    """The LayerNorm node for a match (gamma and beta when bound, else ones and zeros)."""
    view, x = m.view, m["x"]
    n = view.shape(x)[-1]
    gamma, beta = m.get("gamma"), m.get("beta")
    if any(p is not None and not view.is_param(p, n) for p in (gamma, beta)):
        return None
    dtype = view.dtype(x)
    inputs = (
        x,
        gamma if gamma is not None else np.ones(n, dtype=dtype),
        beta if beta is not None else np.zeros(n, dtype=dtype),
    )
    attrs = op_attrs("LayerNorm", eps=m.scalar("eps"))
    return Fusion("LayerNormMulSqrt", m.nodes, "LayerNorm", inputs, m.nodes[0].outputs, attrs)


_SCALED = P("Mul", NORMALIZED, V("gamma"))
RULES = (
    Rule("LayerNormMulSqrt", P("Add", _SCALED, V("beta")), build_layer_norm),
    Rule("LayerNormMulSqrt", _SCALED, build_layer_norm),
    Rule("LayerNormMulSqrt", P("Add", NORMALIZED, V("beta")), build_layer_norm),
    Rule("LayerNormMulSqrt", NORMALIZED, build_layer_norm),
)


@patterns("LayerNormMulSqrt")
def layer_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold a decomposed layer normalization over the last axis into one LayerNorm node.

    Identity: with ``d = x - ReduceMean(x, -1)`` and ``v = ReduceMean(d * d, -1)``:
    ``d / Sqrt(v + eps) * gamma + beta == LayerNorm(x, gamma, beta, eps)``. The canonicalize
    stage brings the other spellings exporters write to this one first (``Pow(d, 2)``,
    ``d * Rsqrt(v + eps)``, ``d * Reciprocal(Sqrt(.))``, commuted operands, no-op casts); ``d``
    may be one node or a ``x - mean`` written again for each use. Without the scale gamma is a
    new constant of ones, without the shift beta one of zeros.

    Preconditions: both means run over the last axis with keepdims; eps is a scalar constant;
    gamma and beta are constants or graph inputs of shape ``(N,)``; the mean, ``d``, the square,
    the variance and every later intermediate are read inside the pattern only and are no graph
    outputs (``d`` by the square and the normalization only).

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
