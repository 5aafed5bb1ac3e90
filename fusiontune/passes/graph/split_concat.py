"""SplitConcatFusionPass: Concat of a Split's pieces in order -> the input, or one Slice."""

from __future__ import annotations

import functools

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.ir.ops import normalize_axis
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Forwarder, View, effective_attrs, op_attrs
from fusiontune.passes.pattern import Match, P, V, match_node
from fusiontune.passes.pipeline import patterns


@functools.cache
def concat_of_pieces(n: int) -> P:
    """``Concat(p_1, ..., p_n)``, each piece an output of one Split node (any output index)."""
    return P("Concat", *(P("Split", V("x"), name="split", output=None) for _ in range(n)))


def _pieces(view: View, concat: Node) -> tuple[Node, int] | None:
    """The Split whose consecutive outputs the Concat joins on the Split's axis, and the first."""
    m = next(match_node(concat_of_pieces(len(concat.inputs)), concat, Match(view)), None)
    if m is None:
        return None
    split = m.node("split")
    rank = len(view.shape(split.inputs[0]))
    axis = normalize_axis(effective_attrs(split)["axis"], rank)
    if normalize_axis(effective_attrs(concat)["axis"], rank) != axis:
        return None
    first = split.outputs.index(concat.inputs[0])
    if split.outputs[first : first + len(concat.inputs)] != concat.inputs:
        return None
    return split, first


@patterns("SplitConcat", "SplitConcatSlice")
def split_concat_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Remove a Concat that undoes a Split.

    Identities, on the Split's axis: ``Concat(Split(x)) == x`` when the Concat joins all pieces
    in order ("SplitConcat"), and ``Concat(pieces i..j) == Slice(x, offset_i, offset_j + size_j)``
    for a consecutive, in-order run ("SplitConcatSlice").

    Preconditions: the Concat joins exactly the run of Split outputs, on the same axis. The Split
    stays when something else reads its pieces (dead-code removal drops it otherwise). When the
    Concat's output is a graph output and all pieces are joined, ``x`` must be written by a node
    and not be a graph output, so the output keeps its name.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    view = View(graph)
    editor = GraphEditor(graph)
    forwarder = Forwarder(view)
    changed = False
    for concat in graph.nodes:
        found = _pieces(view, concat) if concat.op == "Concat" else None
        if found is None:
            continue
        split, first = found
        x, out = split.inputs[0], concat.outputs[0]
        whole = len(concat.inputs) == len(split.outputs)
        if whole and not forwarder.can_forward(out, x):
            continue
        origin = view.origin((split, concat))
        if not ctx.allow("SplitConcat" if whole else "SplitConcatSlice", origin):
            continue
        name = editor.fresh("Slice")
        editor.remove_nodes([concat.name])
        changed = True
        if whole:
            forwarder.forward(out, x)
            continue
        attrs = effective_attrs(split)
        axis = normalize_axis(attrs["axis"], len(view.shape(x)))
        start = sum(attrs["sizes"][:first])
        end = start + sum(attrs["sizes"][first : first + len(concat.inputs)])
        slice_attrs = op_attrs("Slice", starts=(start,), ends=(end,), axes=(axis,), steps=(1,))
        editor.add_node(Node(name, "Slice", (x,), concat.outputs, slice_attrs, origin))
    if not changed:
        return graph
    forwarder.apply(editor)
    return editor.finish()
