"""GeluFusionPass: the exact (erf) GELU subgraph -> Gelu."""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import permutations

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, rewrite
from fusiontune.passes.pipeline import patterns

_SQRT2 = math.sqrt(2.0)


def _product(view: View, mul: Node, depth: int = 0) -> tuple[list[str], list[Node]]:
    """The factors of a tree of Muls whose inner products are read by their parent only."""
    factors: list[str] = []
    nodes = [mul]
    # One level of nesting covers every grouping of three factors; Mul(v, v) is a square.
    nest = depth < 1 and mul.inputs[0] != mul.inputs[1]
    for v in mul.inputs:
        inner = view.producer(v, "Mul")
        reader = view.sole_reader(v)
        if nest and inner is not None and reader is not None and reader.name == mul.name:
            more, inner_nodes = _product(view, inner, depth + 1)
            factors += more
            nodes += inner_nodes
        else:
            factors.append(v)
    return factors, nodes


def _scaled_input(view: View, node: Node | None) -> tuple[str, str] | None:
    """(pattern, x) when ``node`` is ``x / sqrt(2)`` or ``x * (1 / sqrt(2))``."""
    if node is None:
        return None
    if node.op == "Div" and view.scalar_is(node.inputs[1], _SQRT2):
        return "GeluErfDiv", node.inputs[0]
    if node.op == "Mul":
        for x, c in View.orders(node):
            if view.scalar_is(c, 1.0 / _SQRT2):
                return "GeluErfMul", x
    return None


def _find(view: View, root: Node) -> Iterator[Fusion]:
    if root.op != "Mul":
        return
    factors, muls = _product(view, root)
    if len(factors) != 3:
        return
    for i_half, i_add in permutations(range(3), 2):
        x = factors[3 - i_half - i_add]
        add = view.producer(factors[i_add], "Add")
        if add is None or not view.scalar_is(factors[i_half], 0.5):
            continue
        for e, one in View.orders(add):
            erf = view.producer(e, "Erf")
            if erf is None or not view.scalar_is(one, 1.0):
                continue
            scale = view.producer(erf.inputs[0])
            hit = _scaled_input(view, scale)
            if hit is not None and scale is not None and hit[1] == x:
                yield Fusion(hit[0], (*muls, add, erf, scale), "Gelu", (x,), root.outputs)


@patterns("GeluErfDiv", "GeluErfMul")
def gelu_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold the exact GELU, written with erf, into one Gelu node (approximate="none").

    Identity: ``0.5 * x * (1 + erf(x / sqrt(2))) == Gelu(x)``, also with
    ``x * 0.7071067811865476`` for ``x / sqrt(2)``, with the three factors in any grouping
    (``(x * 0.5) * t``, ``x * (0.5 * t)``, ``0.5 * (x * t)``) and any operand order.

    Preconditions: the constants are scalars within 1e-6 of 0.5, 1, sqrt(2) (or 1/sqrt(2)); the
    inner products, the sum, the erf and the scaled input have no readers outside the pattern and
    are no graph outputs; the result has x's shape and dtype.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find)
