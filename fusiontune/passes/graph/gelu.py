"""GeluFusionPass: the GELU subgraphs (erf, and its tanh approximation) -> Gelu."""

from __future__ import annotations

import math

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, op_attrs
from fusiontune.passes.pattern import (
    Any,
    Builder,
    C,
    Match,
    P,
    Pattern,
    Rule,
    V,
    apply_rules,
    products,
)
from fusiontune.passes.pipeline import patterns

SQRT_2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715
"""The cubic coefficient of the tanh approximation (Hendrycks & Gimpel)."""

_x = V("x")
_HALF, _ONE = C(value=0.5), C(value=1.0)


def _gelu(inner: Pattern) -> tuple[P, ...]:
    """``0.5 * x * (1 + inner)`` in every grouping of the three factors (operand order is free)."""
    return products(_HALF, _x, P("Add", inner, _ONE))


# erf: 0.5 * x * (1 + erf(x / sqrt(2))), the scaled input written as a division or a product.
ERF_DIV = _gelu(P("Erf", P("Div", _x, C(value=SQRT_2))))
ERF_MUL = _gelu(P("Erf", P("Mul", _x, C(value=1.0 / SQRT_2))))

# tanh: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 as Pow(x, 3) or x * x * x,
# or Megatron's sqrt(2/pi) * x * (1 + 0.044715 * x * x).
_C, _K = C(value=SQRT_2_OVER_PI), C(value=KAPPA)
_CUBED = Any(P("Mul", P("Pow", _x, C(value=3.0)), _K), *products(_K, _x, _x, _x))
_TANH_ARG = Any(
    P("Mul", P("Add", _x, _CUBED), _C),
    *products(_C, _x, P("Add", Any(*products(_K, _x, _x)), _ONE)),
)
TANH = _gelu(P("Tanh", _TANH_ARG))


def build_gelu(pattern: str, approximate: str = "none") -> Builder:
    """The builder of a GELU subgraph match: one Gelu node of ``x``."""

    def build(m: Match) -> Fusion:
        attrs = op_attrs("Gelu", approximate=approximate)
        return Fusion(pattern, m.nodes, "Gelu", (m["x"],), m.nodes[0].outputs, attrs)

    return build


RULES = (
    *(Rule("GeluErfDiv", p, build_gelu("GeluErfDiv")) for p in ERF_DIV),
    *(Rule("GeluErfMul", p, build_gelu("GeluErfMul")) for p in ERF_MUL),
    *(Rule("GeluTanh", p, build_gelu("GeluTanh", "tanh")) for p in TANH),
)


@patterns("GeluErfDiv", "GeluErfMul", "GeluTanh")
def gelu_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold the GELU, written out with erf or with tanh, into one Gelu node.

    Identity: ``0.5 * x * (1 + erf(x / sqrt(2))) == Gelu(x)`` (approximate="none"), also with
    ``x * 0.7071067811865476`` for ``x / sqrt(2)``, with the three factors in any grouping
    (``(x * 0.5) * t``, ``x * (0.5 * t)``, ``0.5 * (x * t)``) and any operand order. The tanh
    approximation, as GPT-2's ``gelu_new``, T5's gated-gelu and torch's
    ``gelu(approximate="tanh")`` export it:
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) == Gelu(x, approximate="tanh")``
    (pattern ``GeluTanh``), x^3 written ``Pow(x, 3)`` or as a product ``x * x * x`` in any
    grouping (the coefficient anywhere in it), and also as Megatron writes it,
    ``sqrt(2 / pi) * x * (1 + 0.044715 * x * x)``. Exact up to the rounding of the constants.

    Preconditions: the constants are scalars within 1e-6 (relative above 1) of 0.5, 1, sqrt(2)
    or 1/sqrt(2), 3, sqrt(2/pi) and 0.044715 (a float32 export rounds them); the inner products,
    sums, the erf or tanh and the scaled input have no readers outside the pattern and are no
    graph outputs; the result has x's shape and dtype.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
