"""FastGeluPass: the erf GELU -> its tanh approximation (inexact)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph import gelu
from fusiontune.passes.graph._match import Fusion, View, effective_attrs
from fusiontune.passes.pattern import Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns

TANH = {"approximate": "tanh"}

MAX_ABS_ERROR = 4.733e-4
"""``max |gelu_tanh(x) - gelu_erf(x)|`` over all x, float64 (at x = 2.6989; measured on a grid of
2,000,001 points over [-10, 10]; for |x| >= 10 both forms agree exactly in float64)."""

ERROR_PER_UNIT_INPUT = 1.79e-4
"""``max |gelu_tanh(x) - gelu_erf(x)| / |x|`` over all x (at x = -2.592), same grid."""


def _tanh_of_node(m: Match) -> Fusion:
    node = m.nodes[0]
    return Fusion("FastGelu", m.nodes, "Gelu", node.inputs, node.outputs, TANH)


def _exact_gelu(view: View, node: Node) -> bool:
    return effective_attrs(node)["approximate"] == "none"


RULES = (
    Rule("FastGelu", P("Gelu", V("x"), where=_exact_gelu), _tanh_of_node),
    # The erf subgraphs GeluFusionPass matches, straight to the tanh form.
    *(
        Rule(f"Fast{r.name}", r.pattern, gelu.build_gelu(f"Fast{r.name}", "tanh"))
        for r in gelu.RULES
        if r.name.startswith("GeluErf")
    ),
)


@patterns("FastGelu", "FastGeluErfDiv", "FastGeluErfMul")
def fast_gelu_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Replace the exact (erf) GELU by its tanh approximation: an inexact rewrite.

    Identity, approximate: ``0.5 * x * (1 + erf(x / sqrt(2)))`` becomes
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`` (Hendrycks & Gimpel), which
    trades the erf polynomial for one tanh. It applies to a ``Gelu`` node with
    ``approximate="none"`` (pattern ``FastGelu``) and, so that the pass works without
    GeluFusionPass, to the decomposed erf GELU subgraph that GeluFusionPass matches (patterns
    ``FastGeluErfDiv`` and ``FastGeluErfMul``), which becomes one ``Gelu(approximate="tanh")``.

    Error (measured in float64 on a grid of 2,000,001 points over [-10, 10]): the absolute
    difference is at most 4.733e-4 (at x = 2.699), and at most 1.79e-4 * |x| for every x. Relative to
    the erf GELU's value it is at most 2.0e-4 for x >= 0 and 9.7e-4 for x >= -1, and unbounded
    in the negative tail, where both forms tend to 0 (x = -3: 10%). The registry declares
    ``expected_error = 5e-4``: the absolute error on unit-scale activations, i.e. the relative
    error against an output whose magnitude is about 1. Inputs far outside unit scale see up to
    1.79e-4 times their magnitude.

    Preconditions: for a Gelu node, none beyond its ``approximate`` being ``"none"``; for the
    subgraph, GeluFusionPass's (the constants within 1e-6 of 0.5, 1, sqrt(2) or 1/sqrt(2), the
    intermediates read inside the pattern only and no graph outputs).

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
