"""TbeElemwiseConvFusionPass: the Conv kernel computes its input with the elementwise ops before it."""

from __future__ import annotations

from fusiontune.codegen.rules import SCALAR_RULES
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


def _absorb_producer(part: Partition, gid: int) -> bool:
    """Merge the elementwise group that computes the conv group's input into it; False when it
    cannot (another kind of group, a value of it read elsewhere, or the kernel refuses)."""
    graph = part.graph
    conv = next(graph.node(n) for n in part.members[gid] if graph.node(n).op == "Conv")
    # the values the group's prologue reads: the Conv's input, or what computes it
    todo, reads = [conv.inputs[0]], []
    while todo:
        value = todo.pop()
        node = part.producer.get(value)
        if node is None:
            continue
        if part.owner[node] == gid:
            todo += graph.node(node).inputs
        else:
            reads.append(node)
    for node in reads:
        pid = part.owner[node]
        if part.kind(pid) != "loop" or any(op not in SCALAR_RULES for op in part.ops(pid)):
            continue
        if any(
            o in graph.outputs or any(part.owner[r] not in (gid, pid) for r in part.readers(o))
            for n in part.members[pid]
            for o in graph.node(n).outputs
        ):
            continue
        if part.try_merge(gid, pid) is not None:
            return True
    return False


@patterns("ElemwiseConv")
def elemwise_conv_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """The elementwise ops that compute a Conv's input (an unfolded BatchNorm + Relu before the
    conv, DenseNet's pre-activation; a squeeze-and-excite gate's per-channel scale, EfficientNet's
    and MobileNetV3's) run inside the Conv kernel, on each element as its input copy is made
    (codegen/conv.py, the packed kernel): their result is never written to memory, and their
    kernel is gone.

    Identity: each element of the Conv's input goes through the same operations in the same
    order, in the kernel that reads it instead of one that stores it, exactly; the padding stays
    zero, as the Conv pads the prologue's result. Preconditions: the producer group is a loop
    kernel of elementwise ops (``rules.SCALAR_RULES``) over the Conv input's shape or per
    channel; its values are read by the Conv alone; its inputs are not the Conv's weights or read
    by the epilogue; the Conv runs the packed algorithm (the codegen rule's choice: the others
    copy no input); the group DAG stays acyclic. Each formed kernel is one application
    (``ctx.allow``), so bisection can undo a single one.
    """
    part = Partition(fused)
    for gid in part.group_ids():
        if gid in part.members and part.kind(gid) == "conv":
            while _absorb_producer(part, gid):
                pass
    return commit(part, ctx, "TbeElemwiseConvFusionPass", lambda p, g: "ElemwiseConv")
