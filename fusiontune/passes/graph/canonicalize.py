"""CanonicalizationPass: small exact algebraic rules that bring a graph to one normal form.

The rules are the table :data:`fusiontune.passes.graph._canonical_rules.RULES`; this module is
the engine that applies them (:func:`apply_canonical_rules`) and the pass. The pipeline runs the
whole canonicalize stage (constant folding, identity elimination, these rules) to a fixed point
before the GraphFusion passes, whose patterns are written over the normal form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fusiontune.ir.graph import Graph, GraphEditor, Node, Shape, Value
from fusiontune.ir.ops import infer_node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._canonical_rules import RULES, Expr, Replacement, Rule
from fusiontune.passes.graph._match import Forwarder, View
from fusiontune.passes.pattern import Match, match_node
from fusiontune.passes.pipeline import patterns


def _infer(view: View, expr: Expr) -> tuple[Shape, str]:
    """The (shape, dtype) ``expr`` computes; ``ValueError`` when it does not type."""
    ins = [
        view.graph.values[i] if isinstance(i, str) else Value(f"e{k}", *_infer(view, i))
        for k, i in enumerate(expr.inputs)
    ]
    probe = Node("probe", expr.op, tuple(v.name for v in ins), ("probe_out",), dict(expr.attrs))
    try:
        ((shape, dtype),) = infer_node(probe, ins)
    except KeyError as exc:  # an op the catalogue does not have
        raise ValueError(str(exc)) from None
    return shape, dtype


def _valid(view: View, anchor: Node, result: Replacement) -> bool:
    """The replacement computes the anchor's output: same shape and dtype, no self-reference,
    and not the anchor itself again (a rule that rewrites a node into itself would never stop)."""
    out = anchor.outputs[0]
    want = (view.shape(out), view.dtype(out))
    if isinstance(result, str):
        return result != out and (view.shape(result), view.dtype(result)) == want
    if any(isinstance(i, str) and i in anchor.outputs for e in result.nodes() for i in e.inputs):
        return False
    if (result.op, result.inputs, result.attrs) == (
        anchor.op,
        anchor.inputs,
        tuple(sorted(anchor.attrs.items())),
    ):
        return False
    try:
        return _infer(view, result) == want
    except ValueError:
        return False


def _find(
    view: View, rules: Sequence[Rule], anchor: Node
) -> tuple[Rule, Match, Replacement] | None:
    """The first rule, in table order, with a match at ``anchor`` whose replacement is valid."""
    for rule in rules:
        for m in match_node(rule.pattern, anchor, Match(view)):
            result = rule.rewrite(m)
            if result is not None and _valid(view, anchor, result):
                return rule, m, result
    return None


def _absorbed(result: Replacement) -> list[Node]:
    if isinstance(result, str):
        return []
    return list({n.name: n for e in result.nodes() for n in e.stands_for}.values())


@dataclass
class _Built:
    """A new node being assembled; ``origin`` grows when a later rewrite builds the same node."""

    name: str
    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict[str, Any]
    origin: list[str] = field(default_factory=list)

    def node(self) -> Node:
        return Node(self.name, self.op, self.inputs, (self.output,), self.attrs, tuple(self.origin))


class _Builder:
    """Turns replacements into nodes: one node per distinct expression (shared sub-expressions
    of several rewrites in one sweep, such as the ``Sqrt(v)`` of every ``a * Rsqrt(v)``, are
    built once), each new node placed where the node it replaces was."""

    def __init__(self, view: View, editor: GraphEditor) -> None:
        self.view = view
        self.editor = editor
        self.built: dict[tuple[Any, ...], _Built] = {}
        self.at: dict[str, list[_Built]] = {}  # replaced node name -> its new nodes, in order

    def replace(self, anchor: Node, expr: Expr) -> None:
        emitted = self.at.setdefault(anchor.name, [])
        self._build(anchor, expr, emitted, root=True)

    def _build(self, anchor: Node, expr: Expr, emitted: list[_Built], root: bool) -> str:
        ins = tuple(
            i if isinstance(i, str) else self._build(anchor, i, emitted, False) for i in expr.inputs
        )
        stands_for = (anchor, *expr.stands_for) if root or not expr.stands_for else expr.stands_for
        origin = self.view.origin(stands_for)
        if root:
            # The anchor's output keeps its name; a node that keeps its op keeps its name too.
            name = anchor.name if expr.op == anchor.op else self.editor.fresh(expr.op)
            new = _Built(name, expr.op, ins, anchor.outputs[0], dict(expr.attrs), list(origin))
            emitted.append(new)
            return new.output
        key = (expr.op, ins, expr.attrs)
        shared = self.built.get(key)
        if shared is None:
            name = self.editor.fresh(expr.op)
            self.editor.add_value(name, *_infer(self.view, expr))
            shared = self.built[key] = _Built(name, expr.op, ins, name, dict(expr.attrs))
            emitted.append(shared)
        shared.origin.extend(o for o in origin if o not in shared.origin)
        return shared.output

    def nodes(self, graph: Graph, removed: set[str]) -> list[Node]:
        """The graph's nodes in order, each replaced node swapped for its new nodes."""
        out: list[Node] = []
        for node in graph.nodes:
            if node.name in self.at:
                out.extend(b.node() for b in self.at[node.name])
            elif node.name not in removed:
                out.append(node)
        return out


def apply_canonical_rules(graph: Graph, ctx: PassContext, rules: Sequence[Rule]) -> Graph:
    """Apply, in one sweep, every rule application ``ctx`` allows.

    Anchors are tried from the last node backwards, so a rule that consumes a node's producer
    (``x * Reciprocal(Sqrt(v))`` into ``x / Sqrt(v)``) wins over a rule on the producer alone:
    the nodes a match covers are claimed, and no rule anchors on them again in the same sweep.
    The taken applications are then asked for in graph order of their anchors, so application
    indices are stable for a given graph and configuration. Every replacement computes its
    anchor's value from values the snapshot already has upstream of the anchor, so applications
    never conflict; what a sweep leaves (a new ``Rsqrt`` read by a ``Mul``) is the next round's.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context (counts matches, may deny applications).
        rules: tried in order at each anchor.

    Returns:
        The rewritten graph, or ``graph`` itself when nothing was applied.
    """
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        for op in rule.pattern.ops:
            by_op.setdefault(op, []).append(rule)
    view = View(graph)
    claimed: set[str] = set()
    taken: list[tuple[Node, Rule, Replacement]] = []
    for anchor in reversed(graph.nodes):
        if anchor.name in claimed or anchor.op not in by_op or len(anchor.outputs) != 1:
            continue
        found = _find(view, by_op[anchor.op], anchor)
        if found is None:
            continue
        rule, m, result = found
        claimed.update(n.name for n in (*m.nodes, *_absorbed(result)))
        taken.append((anchor, rule, result))
    if not taken:
        return graph
    taken.reverse()
    editor = GraphEditor(graph)
    forwarder = Forwarder(view)
    builder = _Builder(view, editor)
    removed: set[str] = set()
    for anchor, rule, result in taken:
        out = anchor.outputs[0]
        if isinstance(result, str) and not forwarder.can_forward(out, result):
            continue  # a graph output that would become a graph input keeps its node
        if not ctx.allow(rule.name, view.origin([anchor, *_absorbed(result)])):
            continue
        if isinstance(result, str):
            forwarder.forward(out, result)
            removed.add(anchor.name)
        else:
            builder.replace(anchor, result)
    if not removed and not builder.at:
        return graph
    editor.nodes = builder.nodes(graph, removed)
    forwarder.apply(editor)
    return editor.finish()


@patterns(*dict.fromkeys(rule.name for rule in RULES))
def canonicalization(graph: Graph, ctx: PassContext) -> Graph:
    """Rewrite the graph into the canonical form the GraphFusion patterns are written over.

    Identities (each one rule; its pattern name in the log), applied at every node in one sweep;
    the pipeline repeats the canonicalize stage until nothing changes:

    * ``MulReciprocalToDiv``: ``a * Reciprocal(x) == x⁻¹ * a == a / x``;
    * ``MulRsqrtToDiv``: ``a * Rsqrt(x) == Rsqrt(x) * a == a / Sqrt(x)``;
    * ``DivOneToReciprocal``: ``Div(1, y) == Reciprocal(y)``;
    * ``ReciprocalSqrtToRsqrt``: ``Reciprocal(Sqrt(x)) == Rsqrt(x)``;
    * ``PowHalfToSqrt``: ``Pow(x, 0.5) == Sqrt(x)``; ``PowMinusHalfToRsqrt``:
      ``Pow(x, -0.5) == Rsqrt(x)``; ``PowOne``: ``Pow(x, 1) == x``; ``PowMinusOneToReciprocal``:
      ``Pow(x, -1) == Reciprocal(x)``; ``PowTwoToMul``: ``Pow(x, 2) == Mul(x, x)`` (a square has
      one spelling);
    * ``NegNeg``: ``Neg(Neg(x)) == x``; ``ZeroSubToNeg``: ``Sub(0, x) == Neg(x)``;
    * ``ReshapeReshape``: ``Reshape(Reshape(x, s1), s2) == Reshape(x, s2)``;
    * ``ReduceKeepdimsReshape``: ``Reshape(Reduce(x, axes, keepdims=1), s) == Reduce(x, axes,
      keepdims=0)`` when ``s`` is the reduced shape without its unit axes (the backward's
      ``sum_to`` of a bias gradient), and the reduction has no other reader;
    * ``TransposeTranspose``: ``Transpose(Transpose(x, p), q) == Transpose(x, p∘q)`` with
      ``(p∘q)[i] = p[q[i]]`` (IdentityEliminationPass then drops an identity permutation, and a
      Reshape to x's own shape);
    * ``CastRoundTrip``: ``Cast(Cast(x, wide), dtype(x)) == x`` when ``wide`` holds every value
      of x's dtype: float16 -> float32/float64, float32 -> float64, int32 -> int64, bool -> any;
    * ``CommuteOperands``: ``op(a, b) == op(b, a)`` for the commutative ops (Add, Mul, Maximum,
      Minimum, Equal, And, Or, Xor): a non-constant operand comes before a constant one, and of
      two non-constants the one defined first (graph inputs in input order, then node outputs
      by the producing node's position). Two constants keep their order.

    They change at most rounding (``a * (1 / x)`` and ``a / x`` round differently; ``0 - x`` and
    ``-x`` differ in the sign of a zero result), which is why the pass is exact. The rule set
    terminates: every rule removes a node, or moves a node down the order Div(1, .) ->
    Reciprocal -> Rsqrt -> Div(., Sqrt), Pow -> Sqrt / Rsqrt / Reciprocal / Mul, Sub -> Neg, or
    sorts operands by a fixed key; nothing rewrites back.

    Preconditions: scalar operands (the 1 of ``Div(1, y)``, the exponent, the 0 of ``Sub``) are
    one-element constants equal to the number exactly; the replacement has the anchor's shape
    and dtype (a scalar that broadcasts or promotes x never qualifies); the reciprocal rules and
    the fractional powers apply to float values only. ``MulReciprocalToDiv`` and
    ``MulRsqrtToDiv`` apply only when every reader of the reciprocal multiplies by it once and it
    is no graph output, so the reciprocal disappears (otherwise the Mul stays). ``NegNeg``,
    ``PowOne`` and ``CastRoundTrip`` forward the anchor's readers to x; when the anchor's output
    is a graph output, x must be written by a node and be no graph output itself, so the output
    keeps its name. An inner node that other nodes read (the inner Cast, Reshape or Transpose,
    the Sqrt under a Reciprocal) stays for them.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context; one application per rewritten (anchor) node.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_canonical_rules(graph, ctx, RULES)
