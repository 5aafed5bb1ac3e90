"""ConvBiasAddFusionPass: fold a per-channel constant add into the Conv's bias (CANN's
conv + biasAdd graph fusion, seed 002)."""

from __future__ import annotations

import numpy as np

from fusiontune.ir.graph import Graph, Shape
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion
from fusiontune.passes.pattern import Any, Match, P, Rule, V, apply_rules, constant
from fusiontune.passes.pipeline import patterns


def _per_channel(shape: Shape, m: int, rank: int) -> bool:
    """(M, 1, ..., 1) or (1, M, 1, ..., 1) against a conv output of ``rank`` dims (N, M, ...)."""
    if len(shape) not in (rank - 1, rank):
        return False
    full = (1,) * (rank - len(shape)) + tuple(shape)
    return full[1] == m and all(d == 1 for i, d in enumerate(full) if i != 1)


_x, _w = V("x"), V("w")
_CONV = Any(P("Conv", _x, _w, name="conv"), P("Conv", _x, _w, V("b", where=constant), name="conv"))


def _build(m: Match) -> Fusion | None:
    g = m.view.graph
    conv, add, c = m.node("conv"), m.nodes[0], m["c"]
    y = conv.outputs[0]
    shape = m.view.shape(y)
    if not _per_channel(m.view.shape(c), shape[1], len(shape)):
        return None
    bias = g.constants[c].astype(np.float64).reshape(shape[1])
    b = m.get("b")
    if b is not None:
        bias = bias + g.constants[b].astype(np.float64)
    inputs = (m["x"], m["w"], bias.astype(m.view.dtype(y)))
    return Fusion("ConvBiasAdd", m.nodes, "Conv", inputs, add.outputs, dict(conv.attrs))


RULES = (Rule("ConvBiasAdd", P("Add", _CONV, V("c", where=constant)), _build),)


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
    return apply_rules(graph, ctx, RULES)
