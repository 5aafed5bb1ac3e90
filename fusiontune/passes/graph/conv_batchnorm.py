"""ConvBatchnormFusionPass: fold an inference BatchNorm into the Conv that feeds it (CANN's
conv2D + BatchNorm graph fusion, seed 002 figure 1)."""

from __future__ import annotations

import numpy as np

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, effective_attrs
from fusiontune.passes.pattern import Any, Match, P, Rule, V, apply_rules, constant
from fusiontune.passes.pipeline import patterns


def fold_conv_bn(
    w: np.ndarray,
    b: np.ndarray | None,
    scale: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The folded ``(W', b')`` of ``BN(conv(x, W, b))``, computed in float64, cast to W's dtype.

    Args:
        w: conv weight (M, C/group, k...); b: its bias (M,) or None.
        scale, beta, mean, var: BatchNorm parameters, any shape holding M values (M, 1, ...).
        eps: BatchNorm's epsilon.
    """
    m = w.shape[0]
    s = scale.astype(np.float64).reshape(m) / np.sqrt(var.astype(np.float64).reshape(m) + eps)
    bias = np.zeros(m) if b is None else b.astype(np.float64)
    w2 = w.astype(np.float64) * s.reshape((m,) + (1,) * (w.ndim - 1))
    b2 = (bias - mean.astype(np.float64).reshape(m)) * s + beta.astype(np.float64).reshape(m)
    return w2.astype(w.dtype), b2.astype(w.dtype)


_w = V("w", where=constant)
_CONV = Any(
    P("Conv", V("x"), _w, name="conv"), P("Conv", V("x"), _w, V("b", where=constant), name="conv")
)
_BN_PARAMS = tuple(V(p, where=constant) for p in ("scale", "beta", "mean", "var"))


def _build(m: Match) -> Fusion:
    g = m.view.graph
    conv, bn = m.node("conv"), m.nodes[0]
    b = m.get("b")
    scale, beta, mean, var = (g.constants[m[p]] for p in ("scale", "beta", "mean", "var"))
    bias = None if b is None else g.constants[b]
    w2, b2 = fold_conv_bn(
        g.constants[m["w"]], bias, scale, beta, mean, var, float(effective_attrs(bn)["eps"])
    )
    return Fusion("ConvBatchnorm", m.nodes, "Conv", (m["x"], w2, b2), bn.outputs, dict(conv.attrs))


RULES = (Rule("ConvBatchnorm", P("BatchNorm", _CONV, *_BN_PARAMS), _build),)


@patterns("ConvBatchnorm")
def conv_batchnorm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold an inference BatchNorm into the weights and bias of the Conv before it.

    Identity, per output channel m (s = scale, beta = bias, mean and var the BN statistics):
    ``BN(conv(x, W, b)) == conv(x, W', b')`` with ``W'[m] = W[m] * s[m] / sqrt(var[m] + eps)`` and
    ``b'[m] = (b[m] - mean[m]) * s[m] / sqrt(var[m] + eps) + beta[m]`` (b = 0 when the Conv has
    no bias), because the conv is linear in W and b and BN is an affine map per channel.

    Exact up to float rounding: the folded W' and b' are computed in float64 and cast to the
    weights' dtype once, so the fused conv differs from the unfused pair only by the rounding of
    W' and b' and the changed order of operations (a few ulps of the output).

    Preconditions: the Conv's weight (and bias, if any) and the four BatchNorm parameters are
    constants; the Conv's output is read by the BatchNorm alone (as its data input) and is no
    graph output.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
