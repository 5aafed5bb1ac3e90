"""TbeEltwiseSplitFusionPass: cut long elementwise kernels (split point ``cut``)."""

from __future__ import annotations

from fusiontune.codegen.plan import check_fusable
from fusiontune.ir.ops import get_op
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.passes.pipeline import patterns


@patterns("EltwiseChainSplit")
def eltwise_split_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Cut every purely elementwise kernel of more than ``cut`` ops after its ``cut``-th op.

    Identity: a fused elementwise kernel equals the two kernels of its halves with the values
    that cross the cut stored in between, exactly. Why a tuner wants it: a very long chain keeps
    many live values and transcendental calls in one loop (register pressure, no vectorization);
    two shorter loops can be faster even though they move more bytes. ``cut = 0`` means no cut.
    Preconditions: both halves are valid kernels.
    """
    k = ctx.split("cut")
    if k <= 0:
        return fused
    graph = fused.graph
    groups: list[Group] = []
    for g in fused.groups:
        eltwise = all(get_op(graph.node(n).op).kind == "elementwise" for n in g.nodes)
        if eltwise and len(g.nodes) > k:
            head, tail = g.nodes[:k], g.nodes[k:]
            legal = check_fusable(graph, head) is None and check_fusable(graph, tail) is None
            origins = [o for n in g.nodes for o in graph.node(n).origin]
            if legal and ctx.allow("EltwiseChainSplit", origins):
                groups.append(Group(g.name, head, (*g.passes, "TbeEltwiseSplitFusionPass")))
                groups.append(Group(f"{g.name}_split", tail, (*g.passes, "TbeEltwiseSplitFusionPass")))
                continue
        groups.append(g)
    return fused.with_groups(groups)
