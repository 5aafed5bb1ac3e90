"""TbeConvElemwiseFusionPass: the Conv kernel applies the elementwise ops after it as its epilogue."""

from __future__ import annotations

from fusiontune.codegen.rules import SCALAR_RULES
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


def _exported(part: Partition, gid: int) -> list[str]:
    graph = part.graph
    return [
        o
        for n in part.members[gid]
        for o in graph.node(n).outputs
        if o in graph.outputs or any(part.owner[r] != gid for r in part.readers(o))
    ]


def _absorb_one(part: Partition, gid: int) -> bool:
    """Merge one elementwise reader of the conv group's results into it; False when none fits."""
    graph = part.graph
    conv = next(graph.node(n) for n in part.members[gid] if graph.node(n).op == "Conv")
    shape = graph.values[conv.outputs[0]].shape
    for value in _exported(part, gid):
        for reader in part.readers(value):
            target = part.owner[reader]
            node = graph.node(reader)
            if target == gid or len(part.members[target]) != 1 or node.op not in SCALAR_RULES:
                continue
            if any(graph.values[o].shape != shape for o in node.outputs):
                continue
            if part.try_merge(gid, target) is not None:
                return True
    return False


@patterns("ConvElemwise")
def conv_elemwise_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """A Conv and the chain of elementwise ops after it (bias, Relu, Clip, LeakyRelu, HardSwish,
    an unfolded BatchNorm, a residual Add of a same-shape tensor...) become one kernel.

    Identity: ``epilogue(conv(x, W))`` computed on each output block right after the GEMM (or the
    direct loop) writes it, while the block is in cache, equals the separate kernels with the conv
    output stored and read back, exactly: each element goes through the same operations in the
    same order (codegen/conv.py). Preconditions: each absorbed op is elementwise
    (``rules.SCALAR_RULES``), produces the conv output's shape, reads only values that broadcast
    to it per image, per channel or per position, and is not yet in another kernel; the group DAG
    stays acyclic. Each formed kernel is one application (``ctx.allow``), so bisection can undo a
    single one.
    """
    part = Partition(fused)
    for gid in part.group_ids():
        if gid in part.members and part.kind(gid) == "conv":
            while _absorb_one(part, gid):
                pass
    return commit(part, ctx, "TbeConvElemwiseFusionPass", lambda p, g: "ConvElemwise")
