"""SwiGluFusionPass: silu(gate) * up -> SwiGlu."""

from __future__ import annotations

from collections.abc import Iterator

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, rewrite
from fusiontune.passes.pipeline import patterns


def _find(view: View, mul: Node) -> Iterator[Fusion]:
    if mul.op != "Mul":
        return
    for act_value, up in View.orders(mul):
        act = view.producer(act_value, "Silu", "Mul")
        if act is None:
            continue
        if act.op == "Silu":
            yield Fusion("SwiGlu", (act, mul), "SwiGlu", (act.inputs[0], up), mul.outputs)
            continue
        for gate, s in View.orders(act):
            sig = view.producer(s, "Sigmoid")
            if sig is not None and sig.inputs[0] == gate:
                yield Fusion("SwiGluSigmoid", (sig, act, mul), "SwiGlu", (gate, up), mul.outputs)


@patterns("SwiGlu", "SwiGluSigmoid")
def swiglu_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold the gated linear unit with a SiLU gate into one SwiGlu node.

    Identity: ``Silu(g) * u == u * Silu(g) == (g * Sigmoid(g)) * u == SwiGlu(g, u)``, the inner
    product in either operand order.

    Preconditions: the Silu (or the Sigmoid and the product ``g * Sigmoid(g)``) has no reader
    outside the pattern and is no graph output; ``u`` is not one of the pattern's values; the
    result has the broadcast shape and dtype SwiGlu infers.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find)
