"""RotaryPositionEmbeddingFusionPass: x * cos + rotate(x) * sin -> RotaryPositionEmbedding."""

from __future__ import annotations

from collections.abc import Callable

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, effective_attrs, op_attrs
from fusiontune.passes.pattern import Any, C, Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns


def _half(which: int) -> Callable[[View, Node], bool]:
    """A Slice of the first (0) or second (1) half of its input's last axis, step 1."""

    def check(view: View, node: Node) -> bool:
        shape = view.shape(node.inputs[0])
        attrs = effective_attrs(node)
        if not shape or shape[-1] % 2 or len(attrs["axes"]) != 1:
            return False
        if attrs["axes"][0] % len(shape) != len(shape) - 1 or tuple(attrs["steps"] or (1,)) != (1,):
            return False
        h = shape[-1] // 2
        start, end = attrs["starts"][0], attrs["ends"][0]
        return (start, min(end, shape[-1])) == ((0, h) if which == 0 else (h, shape[-1]))

    return check


def _halves_split(view: View, node: Node) -> bool:
    shape = view.shape(node.inputs[0])
    attrs = effective_attrs(node)
    return bool(shape) and attrs["axis"] % len(shape) == len(shape) - 1 and len(set(attrs["sizes"])) == 1


def _last_axis_concat(view: View, node: Node) -> bool:
    return effective_attrs(node)["axis"] % len(view.shape(node.inputs[0])) == len(view.shape(node.inputs[0])) - 1


_x = V("x")


def _negated(p: P) -> Any:
    """``-p``, written as Neg or as a Mul by -1."""
    return Any(P("Neg", p), P("Mul", p, C(value=-1.0, tol=0.0)))


# rotate_half(x) = concat(-x2, x1) of the halves of the last axis, cut by two Slices or one Split
_ROTATED = Any(
    P("Concat", _negated(P("Slice", _x, where=_half(1))), P("Slice", _x, where=_half(0)), where=_last_axis_concat),
    P(
        "Concat",
        _negated(P("Split", _x, where=_halves_split, output=1)),
        P("Split", _x, where=_halves_split, output=0),
        where=_last_axis_concat,
    ),
)
ROTARY = P("Add", P("Mul", _x, V("cos")), P("Mul", _ROTATED, V("sin")))
"""``x * cos + rotate_half(x) * sin`` (either operand order of every Add and Mul)."""


def _build(m: Match) -> Fusion | None:
    x, cos, sin = m["x"], m["cos"], m["sin"]
    view = m.view
    root = m.nodes[0]
    probe = [view.graph.values[v] for v in (x, cos, sin)]
    if any(v.shape[-1:] != probe[0].shape[-1:] or v.dtype != probe[0].dtype for v in probe[1:]):
        return None  # a cos / sin narrower than x is partial rotary: not this op
    if x in (cos, sin):
        return None
    return Fusion("RotaryPositionEmbedding", m.nodes, "RotaryPositionEmbedding", (x, cos, sin), root.outputs, op_attrs("RotaryPositionEmbedding", mode=0))


RULES = (Rule("RotaryPositionEmbedding", ROTARY, _build),)


@patterns("RotaryPositionEmbedding")
def rotary_position_embedding_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold rotary position embeddings, as transformers writes them, into one node.

    Identity: with ``x1, x2`` the halves of x's last axis, ``rotate_half(x) = concat(-x2, x1)``
    and ``x * cos + rotate_half(x) * sin == RotaryPositionEmbedding(x, cos, sin, mode=0)``
    (LLaMA, Qwen2, Mistral, GPT-NeoX: ``apply_rotary_pos_emb``). The halves may be cut by two
    Slices or one Split; the negation may be a Neg or a Mul by -1. The fused kernel reads each row
    of x once and writes y (codegen/rotary.py), where the unfused program writes and reads the
    rotated copy and both products. There is no split point: the op is one pass over x, with
    nothing to cut.

    Preconditions: the Slices cut exactly the two halves of the last axis (step 1), the Concat
    joins them on the last axis; cos and sin broadcast to x over its full last axis (a narrower
    cos is partial rotary, which this pass leaves alone) and have x's dtype; the slices, the
    negation, the rotated copy and both products are read inside the pattern only and are no
    graph outputs.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
