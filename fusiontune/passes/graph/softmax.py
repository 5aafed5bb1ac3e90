"""SoftmaxFusionPass: max / sub / exp / sum / div -> Softmax."""

from __future__ import annotations

from collections.abc import Iterator

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, op_attrs, rewrite
from fusiontune.passes.pipeline import patterns


def _find(view: View, div: Node) -> Iterator[Fusion]:
    if div.op != "Div":
        return
    e, s = div.inputs
    exp = view.producer(e, "Exp")
    total = view.producer(s, "ReduceSum")
    if exp is None or total is None or total.inputs[0] != e:
        return
    sub = view.producer(exp.inputs[0], "Sub")
    if sub is None:
        return
    x, m = sub.inputs
    rmax = view.producer(m, "ReduceMax")
    if rmax is None or rmax.inputs[0] != x:
        return
    axis = view.reduce_axis(rmax)
    if axis is None or view.reduce_axis(total) != axis:
        return
    rank = len(view.shape(x))
    attrs = op_attrs("Softmax", axis=-1 if axis == rank - 1 else axis)
    yield Fusion("Softmax", (rmax, sub, exp, total, div), "Softmax", (x,), div.outputs, attrs)


@patterns("Softmax")
def softmax_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold the decomposed, max-shifted softmax into one Softmax node.

    Identity: with ``m = ReduceMax(x, a)``, ``e = Exp(x - m)``:
    ``e / ReduceSum(e, a) == Softmax(x, a)`` for any single axis ``a``.

    Preconditions: both reductions run over the same single axis with keepdims; the max, the
    difference, the exponentials and the sum have no readers outside the pattern and are no graph
    outputs (the exponentials are read by the sum and the division only).

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find)
