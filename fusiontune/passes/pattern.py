"""Declarative patterns: a GraphFusion pass states what it matches, not how to walk to it.

A pattern is a small tree written over the canonical form (the canonicalize stage runs first, so
one computation has one spelling), in the spirit of tinygrad's ``UPat`` / ``PatternMatcher`` and
Inductor's ``register_replacement``::

    x = V("x")
    ms = P("ReduceMean", P("Mul", x, x), where=last_axis)
    norm = P("Div", x, P("Sqrt", P("Add", ms, C("eps"))))
    RULES = (
        Rule("RmsNorm", P("Mul", norm, V("gamma")), build_rms_norm),
        Rule("RmsNorm", norm, build_rms_norm),
    )

    def rms_norm_fusion(graph, ctx):
        return apply_rules(graph, ctx, RULES)

* :class:`P` matches a node by op (one name or several), its inputs matched in order; for the
  commutative ops (:data:`COMMUTATIVE`) both operand orders are tried. ``name=`` binds the node,
  ``where=`` is a predicate on it.
* :class:`V` matches any value and binds it by name; the same name twice means the same value
  (``P("Mul", x, x)`` is a square). ``where=`` is a predicate on the value.
* :class:`C` matches a one-element constant, optionally equal to a number (within ``tol``,
  relative above 1), and binds it by name.
* :class:`Any` is a choice between patterns, tried in order; :func:`maybe` is the common "this
  unary op, or nothing" choice (a Cast that may or may not be there).

A :class:`Rule` pairs a pattern with a builder: ``build(match) -> Fusion | None`` (None: this
match does not qualify, the matcher tries the next one). :func:`apply_rules` finds, for every
node taken as a root (the node the pattern's top :class:`P` matches), the first rule and match
whose fusion is valid (:meth:`View.valid`: inner values read only inside, the new node types as
the old ones) and shares no node with a fusion already taken. Roots are tried from the last node
backwards, so a larger pattern (an RMSNorm with its scale) wins over the part of it that is a
pattern too (the bare normalization). The taken fusions are then asked for, through
``ctx.allow``, and applied in graph order of their first node: application indices are stable
for a given graph and configuration, which is what lets bisection switch one off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any as AnyType

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import SCALAR_TOL, Fusion, View, closes_cycle

COMMUTATIVE = frozenset({"Add", "Mul", "Maximum", "Minimum", "Equal", "And", "Or", "Xor"})
"""Binary ops whose operands a pattern matches in either order."""

NodePredicate = Callable[[View, Node], bool]
ValuePredicate = Callable[[View, str], bool]


class Pattern:
    """Base of the pattern kinds; see the module docstring."""


@dataclass(frozen=True, eq=False)
class P(Pattern):
    """A node: its op (or ops), its input patterns in order, an optional predicate and name.

    Attributes:
        ops: the op names the node may have.
        inputs: one pattern per input (the node must have exactly that many inputs).
        name: binds the node (``match.node(name)``).
        where: ``(view, node) -> bool``, checked before the inputs are matched.
        output: which output of the node the matched value must be (0 for single-output ops;
            None: any).
    """

    ops: tuple[str, ...]
    inputs: tuple[Pattern, ...]
    name: str | None
    where: NodePredicate | None
    output: int | None

    def __init__(
        self,
        op: str | Sequence[str],
        *inputs: Pattern,
        name: str | None = None,
        where: NodePredicate | None = None,
        output: int | None = 0,
    ) -> None:
        object.__setattr__(self, "ops", (op,) if isinstance(op, str) else tuple(op))
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "output", output)


@dataclass(frozen=True, eq=False)
class V(Pattern):
    """Any value, bound by ``name``; the same name twice must be the same value."""

    name: str
    where: ValuePredicate | None = None


@dataclass(frozen=True, eq=False)
class C(Pattern):
    """A one-element constant, equal to ``value`` (within ``tol``) when one is given."""

    name: str | None = None
    value: float | None = None
    tol: float = SCALAR_TOL


@dataclass(frozen=True, eq=False)
class Any(Pattern):
    """The first of ``options`` that matches (every match of each, in order)."""

    options: tuple[Pattern, ...]

    def __init__(self, *options: Pattern) -> None:
        object.__setattr__(self, "options", tuple(options))


def maybe(op: str | Sequence[str], inner: Pattern, **kwargs: AnyType) -> Any:
    """``op(inner)`` or ``inner`` itself: a unary node that may or may not be there."""
    return Any(P(op, inner, **kwargs), inner)


def products(*factors: Pattern) -> tuple[P, ...]:
    """Every way to write the product of ``factors`` as a tree of binary ``Mul`` nodes.

    Operand order is left to the matcher (Mul is commutative), so ``products(a, b, c)`` is the
    three groupings ``a * (b * c)``, ``(a * b) * c`` and ``(a * c) * b``; four factors give 15.
    A factor passed twice (the same pattern object) yields each distinct tree once:
    ``products(x, x, x)`` is the one tree ``x * (x * x)``.
    """
    if len(factors) < 2:
        raise ValueError("a product needs two factors or more")
    trees: dict[object, P] = {}
    for tree, key in _mul_trees(factors):
        assert isinstance(tree, P)
        trees.setdefault(key, tree)
    return tuple(trees.values())


def _mul_trees(factors: tuple[Pattern, ...]) -> Iterator[tuple[Pattern, object]]:
    """(tree, key) for every Mul tree over ``factors``; equal keys: equal trees up to operand order."""
    if len(factors) == 1:
        yield factors[0], id(factors[0])
        return
    first, rest = factors[0], factors[1:]
    # The part holding the first factor, and the others (never empty): each split once.
    for mask in range(2 ** len(rest) - 1):
        left = (first, *(f for i, f in enumerate(rest) if mask >> i & 1))
        right = tuple(f for i, f in enumerate(rest) if not mask >> i & 1)
        for a, ka in _mul_trees(left):
            for b, kb in _mul_trees(right):
                yield P("Mul", a, b), ("Mul", *sorted((ka, kb), key=repr))


@dataclass(frozen=True)
class Match:
    """One way a pattern matched: bound values and nodes, and every node it covered."""

    view: View
    values: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    named: MappingProxyType[str, Node] = field(default_factory=lambda: MappingProxyType({}))
    nodes: tuple[Node, ...] = ()

    def __getitem__(self, name: str) -> str:
        return self.values[name]

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def node(self, name: str) -> Node:
        return self.named[name]

    def has_node(self, name: str) -> bool:
        return name in self.named

    def scalar(self, name: str) -> float:
        """A bound one-element constant as an attribute value (see :meth:`View.scalar_attr`)."""
        return self.view.scalar_attr(self.values[name])

    def bind(self, name: str, value: str) -> Match | None:
        bound = self.values.get(name)
        if bound is not None:
            return self if bound == value else None
        return Match(self.view, MappingProxyType({**self.values, name: value}), self.named, self.nodes)

    def cover(self, node: Node, name: str | None) -> Match | None:
        named = self.named
        if name is not None:
            bound = named.get(name)
            if bound is not None and bound.name != node.name:
                return None
            named = MappingProxyType({**named, name: node})
        nodes = self.nodes if any(n.name == node.name for n in self.nodes) else (*self.nodes, node)
        return Match(self.view, self.values, named, nodes)


def match_value(pattern: Pattern, value: str, m: Match) -> Iterator[Match]:
    """Every way ``pattern`` matches ``value``, extending ``m``."""
    view = m.view
    if isinstance(pattern, V):
        if pattern.where is not None and pattern.name not in m.values and not pattern.where(view, value):
            return
        bound = m.bind(pattern.name, value)
        if bound is not None:
            yield bound
    elif isinstance(pattern, C):
        scalar = view.graph.scalar_constant(value)
        if scalar is None:
            return
        if pattern.value is not None and abs(scalar - pattern.value) > pattern.tol * max(1.0, abs(pattern.value)):
            return
        if pattern.name is None:
            yield m
            return
        bound = m.bind(pattern.name, value)
        if bound is not None:
            yield bound
    elif isinstance(pattern, Any):
        for option in pattern.options:
            yield from match_value(option, value, m)
    elif isinstance(pattern, P):
        node = view.producer(value)
        if node is None:
            return
        if pattern.output is not None and node.outputs.index(value) != pattern.output:
            return
        yield from match_node(pattern, node, m)
    else:  # pragma: no cover - the four kinds above are all there is
        raise TypeError(f"not a pattern: {pattern!r}")


def match_node(pattern: P, node: Node, m: Match) -> Iterator[Match]:
    """Every way the node pattern ``pattern`` matches ``node``, extending ``m``."""
    if node.op not in pattern.ops or len(node.inputs) != len(pattern.inputs):
        return
    if pattern.where is not None and not pattern.where(m.view, node):
        return
    covered = m.cover(node, pattern.name)
    if covered is None:
        return
    orders: list[tuple[str, ...]] = [node.inputs]
    if node.op in COMMUTATIVE and len(node.inputs) == 2 and node.inputs[0] != node.inputs[1]:
        orders.append(node.inputs[::-1])
    for inputs in orders:
        yield from _match_all(pattern.inputs, inputs, covered)


def _match_all(patterns: Sequence[Pattern], values: Sequence[str], m: Match) -> Iterator[Match]:
    if not patterns:
        yield m
        return
    for first in match_value(patterns[0], values[0], m):
        yield from _match_all(patterns[1:], values[1:], first)


Builder = Callable[[Match], Fusion | None]


@dataclass(frozen=True)
class Rule:
    """A named pattern and what it becomes.

    Attributes:
        name: the pattern name in the fusion log (``pattern=<name>``).
        pattern: the pattern; its top is the node the fusion replaces last (the root).
        build: ``match -> Fusion`` (None: the match does not qualify).
    """

    name: str
    pattern: P
    build: Builder


def find(view: View, rules: Sequence[Rule], root: Node) -> Iterator[Fusion]:
    """The candidate fusions of ``rules`` rooted at ``root``, in rule order."""
    for rule in rules:
        if root.op not in rule.pattern.ops:
            continue
        for m in match_node(rule.pattern, root, Match(view)):
            fusion = rule.build(m)
            if fusion is not None:
                yield fusion


def apply_rules(graph: Graph, ctx: PassContext, rules: Sequence[Rule]) -> Graph:
    """Apply every valid, non-overlapping fusion of ``rules`` that ``ctx`` allows.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context (counts matches, may deny applications).
        rules: tried in order at each root; put a larger pattern before the part of it that is a
            pattern of its own.

    Returns:
        The rewritten graph, or ``graph`` itself when nothing was applied.
    """
    view = View(graph)
    claimed: set[str] = set()
    taken: list[Fusion] = []
    for root in reversed(graph.nodes):
        if root.name in claimed:
            continue
        fusion = next((f for f in find(view, rules, root) if not (f.names & claimed) and view.valid(f)), None)
        if fusion is not None:
            claimed |= fusion.names
            taken.append(fusion)
    if not taken:
        return graph
    position = graph.node_position
    taken.sort(key=lambda f: min(position(n.name) for n in f.nodes))
    editor = GraphEditor(graph)
    changed = False
    for fusion in taken:
        if closes_cycle(editor, fusion):
            continue
        origin = view.origin(fusion.nodes)
        if ctx.allow(fusion.pattern, origin):
            fusion.apply(editor, origin)
            changed = True
    return editor.finish() if changed else graph


# ---- predicates the passes share -------------------------------------------------------------
def last_axis(view: View, node: Node) -> bool:
    """A keepdims reduction over the last axis only."""
    shape = view.shape(node.inputs[0])
    return bool(shape) and view.reduce_axis(node) == len(shape) - 1


def constant(view: View, value: str) -> bool:
    return view.graph.is_constant(value)


def not_constant(view: View, value: str) -> bool:
    return not view.graph.is_constant(value)
