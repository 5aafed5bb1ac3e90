"""ConvBiasAddFusionPass: fold a per-channel constant add into the Conv's bias (CANN's
conv + biasAdd graph fusion, seed 002)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fusiontune.ir.graph import Graph, Node, Shape
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, rewrite
from fusiontune.passes.pipeline import patterns


def _per_channel(shape: Shape, m: int, rank: int) -> bool:
    """(M, 1, ..., 1) or (1, M, 1, ..., 1) against a conv output of ``rank`` dims (N, M, ...)."""
    if len(shape) not in (rank - 1, rank):
        return False
    full = (1,) * (rank - len(shape)) + tuple(shape)
    return full[1] == m and all(d == 1 for i, d in enumerate(full) if i != 1)


def _find(view: View, conv: Node) -> Iterator[Fusion]:
    g = view.graph
    if conv.op != "Conv" or (len(conv.inputs) == 3 and not g.is_constant(conv.inputs[2])):
        return
    y = conv.outputs[0]
    add = view.sole_reader(y, "Add")
    if add is None:
        return
    shape = view.shape(y)
    m = shape[1]
    for a, c in View.orders(add):
        if a == y and g.is_constant(c) and _per_channel(view.shape(c), m, len(shape)):
            bias = g.constants[c].astype(np.float64).reshape(m)
            if len(conv.inputs) == 3:
                bias = bias + g.constants[conv.inputs[2]].astype(np.float64)
            dtype = view.dtype(y)
            yield Fusion("ConvBiasAdd", (conv, add), "Conv", (*conv.inputs[:2], bias.astype(dtype)), add.outputs, dict(conv.attrs))


@patterns("ConvBiasAdd")
def conv_bias_add_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Give a Conv the per-channel constant that the next node adds.

    Identity: ``conv(x, W, b) + c == conv(x, W, b + c)`` for ``c`` constant per output channel
    (shape ``(M, 1, ...)`` or ``(1, M, 1, ...)``), since the bias is added to every position of
    its channel; without a bias, ``b = 0``. Exact up to float rounding: ``b + c`` is computed in
    float64 and cast once.

    Preconditions: the Conv's bias, if any, is a constant; its output is read by the Add alone
    and is no graph output; the Add's other operand is such a constant (it broadcasts without
    changing the output shape).

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find)
