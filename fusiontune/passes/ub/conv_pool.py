"""ConvMaxPoolFusionPass: a MaxPool after a Conv (and its epilogue) runs in the conv's kernel."""

from __future__ import annotations

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


def _absorb_pool(part: Partition, gid: int) -> bool:
    """Merge the MaxPool that alone reads the conv group's one result into it."""
    graph = part.graph
    exported = [o for n in part.members[gid] for o in graph.node(n).outputs
                if o in graph.outputs or any(part.owner[r] != gid for r in part.readers(o))]
    if len(exported) != 1 or exported[0] in graph.outputs:
        return False
    readers = part.readers(exported[0])
    if len(readers) != 1 or graph.node(readers[0]).op != "MaxPool":
        return False
    target = part.owner[readers[0]]
    return len(part.members[target]) == 1 and part.try_merge(gid, target) is not None


@patterns("ConvMaxPool")
def conv_max_pool_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """A MaxPool that reads a conv kernel's one result (a CNN stem's Conv + Relu + MaxPool, a VGG
    block's end) becomes the end of that kernel.

    The conv kernel computes a whole output plane of an image's channels into its block (the
    packed kernel's ``lanes`` layout: positions by channels), runs its epilogue there, and then
    takes each pool window's max over rows of channels while the block is in cache
    (codegen/conv.py ``_pool_lines``): the conv's output is never stored, and the pool reads
    contiguous channels instead of strided columns of a plane. Identity: each pooled element is
    the max of the same epilogue results over the same window (NaN if any is NaN; the padding is
    never read), exactly. Preconditions: the conv group's only exported value is read by the
    MaxPool alone and is no graph output; the MaxPool is 2-D with no Indices output, its windows
    lie inside the plane (no pads, no ceil_mode overhang) and hold at most 25 taps; the plane of one image and group fits
    ``codegen.conv.POOL_FUSED_MAX_BYTES``; and there are at least as many (image, group) tasks as
    numba threads, since a task now holds a whole plane. fusiontune's own switch: CANN has no
    pass of this name.
    """
    part = Partition(fused)
    for gid in part.group_ids():
        if gid in part.members and part.kind(gid) == "conv" and "MaxPool" not in part.ops(gid):
            _absorb_pool(part, gid)
    return commit(part, ctx, "ConvMaxPoolFusionPass", lambda p, g: "ConvMaxPool")
