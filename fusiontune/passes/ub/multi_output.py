"""TbeMultiOutputFusionPass: sibling loops become one multi-output kernel.

Two kinds of siblings: loop groups that read a common input (``TbeMultiOutputFusion``), and
reductions over the same leading axes of same-shape tensors that come from one producer
and are related (``ReduceMultiOutputFusion``: they read a value or a producer group in common): a training step's bias, gamma and beta gradients, ``sum(dy)`` and
``sum(dy * xhat)`` over the rows, each with its optimizer update as epilogue.
"""

from __future__ import annotations

from fusiontune.ir.ops import normalize_axes
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit

Signature = tuple[tuple[int, ...], tuple[int, ...]]


def _row_reduction(part: Partition, gid: int) -> Signature | None:
    """``(shape, axes)`` when every reduction of the loop group sums the same leading axes of
    the same shape (a gradient reduction over rows), else None."""
    graph = part.graph
    sigs = set()
    for name in part.members[gid]:
        node = graph.node(name)
        if not node.op.startswith("Reduce"):
            continue
        shape = graph.values[node.inputs[0]].shape
        axes = normalize_axes(node.attrs.get("axes"), len(shape))
        if not axes or axes != tuple(range(len(axes))) or len(axes) == len(shape):
            return None
        sigs.add((tuple(shape), axes))
    return sigs.pop() if len(sigs) == 1 else None


def _related(part: Partition, a: int, b: int) -> bool:
    """The groups read a value or a producer group in common (gamma's and beta's gradients read
    LayerNormGrad's outputs). Not further back: through a residual, every layer's gradients are
    related, and one kernel for all of them would keep the first layer's inputs alive to the end."""
    return bool(_sources(part, a) & _sources(part, b))


def _sources(part: Partition, gid: int) -> set[str]:
    """What the group reads from other groups: the values, and the producing groups (``#id``)."""
    graph = part.graph
    inside = set(part.members[gid])
    out: set[str] = set()
    for name in part.members[gid]:
        for value in graph.node(name).inputs:
            src = part.producer.get(value)
            if src is None or src in inside:
                continue
            out.add(value)
            out.add(f"#{part.owner[src]}")
    return out


@patterns("TbeMultiOutputFusion", "ReduceMultiOutputFusion")
def multi_output_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Merge sibling loop-nest groups into one kernel with several outputs.

    Identity: two independent loops over the same domain equal one loop computing both outputs;
    a shared input is read from memory once instead of twice, and one kernel call replaces two.
    Siblings are loop groups that read a common non-constant input, or groups whose reductions
    sum the same leading axes of same-shape tensors read from one producer group or one value
    (the bias, gamma and beta gradients of a training step, whose optimizer updates ride along
    as their epilogues). Preconditions: neither group depends on the other (directly or through
    a third group), and one loop domain holds both.
    """
    part = Partition(fused)
    graph = fused.graph
    for value in list(graph.values):
        if graph.is_constant(value):
            continue
        readers = [part.owner[r] for r in part.readers(value)]
        siblings = [g for g in dict.fromkeys(readers) if part.kind(g) == "loop"]
        while len(siblings) > 1:
            head = siblings.pop(0)
            if head not in part.members:
                continue
            for other in list(siblings):
                if other in part.members and part.try_merge(head, other) is not None:
                    siblings.remove(other)
    reduce_merged: set[int] = set()
    changed = True
    while changed:
        changed = False
        rows = [(g, s) for g in part.group_ids() if part.kind(g) == "loop" and (s := _row_reduction(part, g))]
        for i, (head, sig) in enumerate(rows):
            if head not in part.members:
                continue
            for other, other_sig in rows[i + 1 :]:
                if other not in part.members or other_sig != sig:
                    continue
                if not _related(part, head, other):
                    continue
                if part.try_merge(head, other) is not None:
                    reduce_merged.add(head)
                    changed = True
    return commit(
        part, ctx, "TbeMultiOutputFusionPass",
        lambda p, g: "ReduceMultiOutputFusion" if g in reduce_merged else "TbeMultiOutputFusion",
    )
