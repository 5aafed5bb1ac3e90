"""RmsNormFusionPass: decomposed mean-of-squares normalization -> RMSNorm."""

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
    square = view.producer(mean.inputs[0], "Pow", "Mul")
    if square is None:
        return
    x = square.inputs[0]
    kind = square_kind(view, square, x)
    shape = view.shape(x)
    if kind is None or not shape or view.reduce_axis(mean) != len(shape) - 1:
        return
    normalized = normalize_from(view, mean.outputs[0], x)
    if normalized is None:
        return
    n = shape[-1]
    extra, gamma, _ = scale_shift(view, normalized.out, n, shift=False)
    inputs = (x, gamma if gamma is not None else np.ones(n, dtype=view.dtype(x)))
    nodes = (square, mean, *normalized.nodes, *extra)
    attrs = op_attrs("RMSNorm", eps=normalized.eps)
    yield Fusion(
        f"RmsNorm{kind}{normalized.root}", nodes, "RMSNorm", inputs, nodes[-1].outputs, attrs
    )


@patterns("RmsNormMulRsqrt", "RmsNormMulSqrt", "RmsNormPowRsqrt", "RmsNormPowSqrt")
def rms_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold a decomposed RMS normalization over the last axis into one RMSNorm node.

    Identity: with ``ms = ReduceMean(x², -1)``:
    ``x * Rsqrt(ms + eps) * gamma == x / Sqrt(ms + eps) * gamma == RMSNorm(x, gamma, eps)``,
    where ``x²`` is ``Mul(x, x)`` or ``Pow(x, 2)``. Without the scale gamma is a new constant of
    ones.

    Preconditions: the mean runs over the last axis with keepdims; eps is a scalar constant;
    gamma is a constant or graph input of shape ``(N,)``; the square, the mean and every later
    intermediate are read inside the pattern only and are no graph outputs.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find)
