"""SwiGluFusionPass: silu(gate) * up -> SwiGlu."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion
from fusiontune.passes.pattern import Builder, Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns

_gate, _up = V("gate"), V("up")


def _build(pattern: str) -> Builder:
    def build(m: Match) -> Fusion:
        return Fusion(pattern, m.nodes, "SwiGlu", (m["gate"], m["up"]), m.nodes[0].outputs)

    return build


RULES = (
    Rule("SwiGlu", P("Mul", P("Silu", _gate), _up), _build("SwiGlu")),
    Rule(
        "SwiGluSigmoid",
        P("Mul", P("Mul", _gate, P("Sigmoid", _gate)), _up),
        _build("SwiGluSigmoid"),
    ),
)


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
    return apply_rules(graph, ctx, RULES)
