"""GeGluFusionPass: gelu(gate) * up -> GeGlu."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, effective_attrs, op_attrs
from fusiontune.passes.pattern import Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns


def _build(m: Match) -> Fusion:
    approximate = effective_attrs(m.node("gelu"))["approximate"]
    attrs = op_attrs("GeGlu", approximate=approximate)
    return Fusion("GeGlu", m.nodes, "GeGlu", (m["gate"], m["up"]), m.nodes[0].outputs, attrs)


RULES = (Rule("GeGlu", P("Mul", P("Gelu", V("gate"), name="gelu"), V("up")), _build),)


@patterns("GeGlu")
def geglu_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold the gated linear unit with a GELU gate into one GeGlu node (T5's gated-gelu).

    Identity: ``Gelu(g, approximate) * u == u * Gelu(g, approximate) == GeGlu(g, u, approximate)``
    for either GELU, the erf one or its tanh approximation (``approximate`` carries over).
    GeluFusionPass, which runs before, makes the Gelu node out of its written-out forms.

    Preconditions: the Gelu has no reader outside the pattern and is no graph output; ``u`` is not
    the Gelu itself; the result has the broadcast shape and dtype GeGlu infers.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
