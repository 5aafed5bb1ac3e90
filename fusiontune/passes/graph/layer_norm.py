"""LayerNormFusionPass: decomposed mean/variance normalization -> LayerNorm."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, op_attrs, rewrite
from fusiontune.passes.graph._norm import normalize_from, scale_shift, square_kind
from fusiontune.passes.pipeline import patterns


def _find(view: View, mean: Node) -> Iterator[Fusion]:
    if mean.op != "ReduceMean":
        return
    x, m = mean.inputs[0], mean.outputs[0]
    shape = view.shape(x)
    if not shape or view.reduce_axis(mean) != len(shape) - 1:
        return
    sub = view.sole_reader(m, "Sub")
    if sub is None or sub.inputs != (x, m):
        return
    d = sub.outputs[0]
    users = view.readers(d)
    if len(users) != 2:
        return
    for square, other in (users, users[::-1]):
        kind = square_kind(view, square, d)
        var = view.sole_reader(square.outputs[0], "ReduceMean")
        if kind is None or var is None or view.reduce_axis(var) != len(shape) - 1:
            continue
        normalized = normalize_from(view, var.outputs[0], d)
        if normalized is None or normalized.out.name != other.name:
            continue
        n = shape[-1]
        extra, gamma, beta = scale_shift(view, normalized.out, n, shift=True)
        dtype = view.dtype(x)
        inputs = (
            x,
            gamma if gamma is not None else np.ones(n, dtype=dtype),
            beta if beta is not None else np.zeros(n, dtype=dtype),
        )
        nodes = (mean, sub, square, var, *normalized.nodes, *extra)
        pattern = f"LayerNorm{kind}{normalized.root}"
        attrs = op_attrs("LayerNorm", eps=normalized.eps)
        yield Fusion(pattern, nodes, "LayerNorm", inputs, nodes[-1].outputs, attrs)


@patterns("LayerNormPowSqrt", "LayerNormPowRsqrt", "LayerNormMulSqrt", "LayerNormMulRsqrt")
def layer_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold a decomposed layer normalization over the last axis into one LayerNorm node.

    Identity: with ``d = x - ReduceMean(x, -1)`` and ``v = ReduceMean(d², -1)``:
    ``d / Sqrt(v + eps) * gamma + beta == d * Rsqrt(v + eps) * gamma + beta
    == LayerNorm(x, gamma, beta, eps)``, where ``d²`` is ``Pow(d, 2)`` or ``Mul(d, d)``. Without
    the scale gamma is a new constant of ones, without the shift beta one of zeros.

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
    return rewrite(graph, ctx, _find)
