"""The canonicalization rules: small exact rewrites, one entry of :data:`RULES` each.

A :class:`Rule` is a name (its pattern name in the fusion log), a pattern whose top node is the
*anchor* (written with :mod:`fusiontune.passes.pattern`'s ``P`` / ``V`` / ``C``; commutative ops
match in either operand order), and a function ``match -> replacement`` that says what the
anchor's output becomes, or None when this match does not qualify:

* a value name: the anchor is removed and its readers read that value (``Neg(Neg(x)) -> x``);
* an :class:`Expr`: new nodes that compute the anchor's output under its name
  (``Pow(x, 2) -> Mul(x, x)``).

The engine (:func:`fusiontune.passes.graph.canonicalize.apply_canonical_rules`) checks that the
replacement has the anchor's shape and dtype (so a scalar operand that broadcasts or promotes
never qualifies), keeps graph output names, and asks ``ctx.allow``. Adding a rule is one entry
here and one line in the pass docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any as AnyType

from fusiontune.ir.graph import Node
from fusiontune.ir.ops import FLOAT_DTYPES
from fusiontune.passes.graph._match import View, effective_attrs
from fusiontune.passes.pattern import COMMUTATIVE, C, Match, P, V


@dataclass(frozen=True)
class Expr:
    """A new node to build: ``op(*inputs, **attrs)``.

    Attributes:
        op: the op.
        inputs: value names of the graph, or nested expressions.
        attrs: attributes as sorted ``(name, value)`` pairs.
        stands_for: matched nodes this new node replaces besides the anchor (they die with the
            rewrite): their original names go to its ``origin``. For a nested expression, the
            nodes it stands for (the anchor's origin when empty).
    """

    op: str
    inputs: tuple[str | Expr, ...]
    attrs: tuple[tuple[str, AnyType], ...] = ()
    stands_for: tuple[Node, ...] = ()

    def nodes(self) -> Iterable[Expr]:
        """This expression and every nested one, inputs first."""
        for i in self.inputs:
            if isinstance(i, Expr):
                yield from i.nodes()
        yield self


def E(op: str, *inputs: str | Expr, stands_for: Iterable[Node] = (), **attrs: AnyType) -> Expr:
    """Shorthand for :class:`Expr`: ``E("Div", a, E("Sqrt", b))``."""
    return Expr(op, tuple(inputs), tuple(sorted(attrs.items())), tuple(stands_for))


Replacement = str | Expr
RewriteFn = Callable[[Match], Replacement | None]


@dataclass(frozen=True)
class Rule:
    """One canonicalization rule.

    Attributes:
        name: the pattern name in the fusion log (``pattern=<name>``).
        pattern: what it matches; its top node (the anchor) is the node the rule replaces.
        rewrite: ``match -> replacement`` (None: this match does not qualify).
    """

    name: str
    pattern: P
    rewrite: RewriteFn


# ---- helpers ---------------------------------------------------------------------------------
def _float(view: View, value: str) -> bool:
    return view.dtype(value) in FLOAT_DTYPES


def _exact(value: float) -> C:
    """A one-element constant equal to ``value`` exactly (x ** 0.5000001 is not a square root)."""
    return C(value=value, tol=0.0)


def _dies_with(m: Match, node: Node) -> tuple[Node, ...]:
    """``(node,)`` when the anchor is the only reader of ``node`` (and it is no graph output)."""
    reader = m.view.sole_reader(node.outputs[0])
    return (node,) if reader is not None and reader.name == m.nodes[0].name else ()


def _only_scaled_by(view: View, value: str) -> bool:
    """Every reader of ``value`` multiplies by it once (``Mul(a, value)``, a != value) and it is
    no graph output: rewriting each reader as a division leaves the value unread."""
    readers = view.readers(value)
    return (
        bool(readers)
        and not view.is_output(value)
        and all(r.op == "Mul" and r.inputs.count(value) == 1 for r in readers)
    )


def _first_reader(m: Match, node: Node) -> tuple[Node, ...]:
    """``(node,)`` when the anchor is the first reader of ``node`` in graph order, else ()."""
    readers = m.view.readers(node.outputs[0])
    return (node,) if readers and readers[0].name == m.nodes[0].name else ()


def _perm(view: View, node: Node) -> tuple[int, ...]:
    rank = len(view.shape(node.inputs[0]))
    return tuple(effective_attrs(node).get("perm") or reversed(range(rank)))


# Casts ``x -> wide -> x`` that lose nothing: ``wide`` holds every value of x's dtype.
EXACT_WIDENING: dict[str, frozenset[str]] = {
    "float16": frozenset({"float32", "float64"}),
    "float32": frozenset({"float64"}),
    "int32": frozenset({"int64"}),
    "bool": frozenset({"float16", "float32", "float64", "int32", "int64"}),
}


def operand_rank(view: View, value: str) -> tuple[int, int, int]:
    """Where ``value`` is defined, for the canonical operand order of commutative ops.

    Graph inputs in input order come first, then node outputs by the producing node's position
    (and output index), then constants (all equal: two constants are never reordered).
    """
    graph = view.graph
    if graph.is_constant(value):
        return (2, 0, 0)
    if value in graph.inputs:
        return (0, graph.inputs.index(value), 0)
    node = view.producer(value)
    assert node is not None, f"{value} has no definition"
    return (1, graph.node_position(node.name), node.outputs.index(value))


# ---- the rules -------------------------------------------------------------------------------
_x, _a, _b = V("x"), V("a"), V("b")
_fx, _fy = V("x", where=_float), V("y", where=_float)


def _reciprocal_sqrt_to_rsqrt(m: Match) -> Replacement:
    root = m.node("root")
    return E("Rsqrt", m["x"], stands_for=_dies_with(m, root))


def _mul_reciprocal_to_div(m: Match) -> Replacement | None:
    r = m.node("r")
    if not _only_scaled_by(m.view, r.outputs[0]):
        return None
    return E("Div", m["a"], m["x"], stands_for=_first_reader(m, r))


def _mul_rsqrt_to_div(m: Match) -> Replacement | None:
    r = m.node("r")
    if not _only_scaled_by(m.view, r.outputs[0]):
        return None
    # Every reader builds the same Sqrt(x): the engine makes it one node, standing for the Rsqrt.
    return E("Div", m["a"], E("Sqrt", m["x"], stands_for=(r,)))


def _reshape_reshape(m: Match) -> Replacement:
    inner = m.node("inner")
    shape = m.view.shape(m.nodes[0].outputs[0])
    return E("Reshape", m["x"], stands_for=_dies_with(m, inner), shape=shape)


def _transpose_transpose(m: Match) -> Replacement:
    outer, inner = m.nodes[0], m.node("inner")
    p_in, p_out = _perm(m.view, inner), _perm(m.view, outer)
    perm = tuple(p_in[i] for i in p_out)
    return E("Transpose", m["x"], stands_for=_dies_with(m, inner), perm=perm)


REDUCE_OPS = ("ReduceMax", "ReduceMean", "ReduceSum")


def _reduce_squeeze(m: Match) -> Replacement | None:
    red, view = m.node("red"), m.view
    attrs = effective_attrs(red)
    shape = view.shape(m["x"])
    if not attrs.get("keepdims", True) or not _dies_with(m, red):
        return None
    axes = attrs.get("axes")
    rank = len(shape)
    axes = tuple(range(rank)) if axes is None else tuple(sorted(a % rank for a in axes))
    squeezed = tuple(d for i, d in enumerate(shape) if i not in axes)
    if tuple(view.shape(m.nodes[0].outputs[0])) != squeezed:
        return None
    return E(red.op, m["x"], stands_for=(red,), axes=axes, keepdims=False)


def _cast_round_trip(m: Match) -> Replacement | None:
    view, x = m.view, m["x"]
    wide = view.dtype(m.node("inner").outputs[0])
    if view.dtype(m.nodes[0].outputs[0]) != view.dtype(x):
        return None
    return x if wide in EXACT_WIDENING.get(view.dtype(x), ()) else None


def _commute(m: Match) -> Replacement | None:
    node = m.nodes[0]
    a, b = node.inputs
    if a == b or operand_rank(m.view, b) >= operand_rank(m.view, a):
        return None
    return E(node.op, b, a, **node.attrs)


RULES: tuple[Rule, ...] = (
    # Division is the one form of "times a reciprocal"; before the reciprocal rules, so that
    # x * Reciprocal(Sqrt(v)) becomes x / Sqrt(v) at once.
    Rule(
        "MulReciprocalToDiv",
        P("Mul", _a, P("Reciprocal", _fx, name="r")),
        _mul_reciprocal_to_div,
    ),
    Rule("MulRsqrtToDiv", P("Mul", _a, P("Rsqrt", _fx, name="r")), _mul_rsqrt_to_div),
    Rule("DivOneToReciprocal", P("Div", _exact(1.0), _fy), lambda m: E("Reciprocal", m["y"])),
    Rule(
        "ReciprocalSqrtToRsqrt",
        P("Reciprocal", P("Sqrt", _fx, name="root")),
        _reciprocal_sqrt_to_rsqrt,
    ),
    Rule("PowHalfToSqrt", P("Pow", _fx, _exact(0.5)), lambda m: E("Sqrt", m["x"])),
    Rule("PowMinusHalfToRsqrt", P("Pow", _fx, _exact(-0.5)), lambda m: E("Rsqrt", m["x"])),
    Rule("PowOne", P("Pow", _x, _exact(1.0)), lambda m: m["x"]),
    Rule("PowMinusOneToReciprocal", P("Pow", _fx, _exact(-1.0)), lambda m: E("Reciprocal", m["x"])),
    Rule("PowTwoToMul", P("Pow", _x, _exact(2.0)), lambda m: E("Mul", m["x"], m["x"])),
    Rule("NegNeg", P("Neg", P("Neg", _x)), lambda m: m["x"]),
    Rule("ZeroSubToNeg", P("Sub", _exact(0.0), _x), lambda m: E("Neg", m["x"])),
    Rule("ReshapeReshape", P("Reshape", P("Reshape", _x, name="inner")), _reshape_reshape),
    Rule(
        "TransposeTranspose",
        P("Transpose", P("Transpose", _x, name="inner")),
        _transpose_transpose,
    ),
    Rule("ReduceKeepdimsReshape", P("Reshape", P(REDUCE_OPS, _x, name="red")), _reduce_squeeze),
    Rule("CastRoundTrip", P("Cast", P("Cast", _x, name="inner")), _cast_round_trip),
    Rule("CommuteOperands", P(tuple(sorted(COMMUTATIVE)), _a, _b), _commute),
)
"""Tried in order at each anchor; the first rule whose replacement is valid wins."""
