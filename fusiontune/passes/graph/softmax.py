"""SoftmaxFusionPass: max / sub / exp / sum / div -> Softmax."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, op_attrs
from fusiontune.passes.pattern import Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns

_x = V("x")
_EXP = P("Exp", P("Sub", _x, P("ReduceMax", _x, name="max")), name="exp")
PATTERN = P("Div", _EXP, P("ReduceSum", _EXP, name="sum"))
"""``Exp(x - ReduceMax(x)) / ReduceSum(Exp(x - ReduceMax(x)))``, one Exp node."""


def _build(m: Match) -> Fusion | None:
    view = m.view
    axis = view.reduce_axis(m.node("max"))
    if axis is None or view.reduce_axis(m.node("sum")) != axis:
        return None
    rank = len(view.shape(m["x"]))
    attrs = op_attrs("Softmax", axis=-1 if axis == rank - 1 else axis)
    return Fusion("Softmax", m.nodes, "Softmax", (m["x"],), m.nodes[0].outputs, attrs)


RULES = (Rule("Softmax", PATTERN, _build),)


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
    return apply_rules(graph, ctx, RULES)
