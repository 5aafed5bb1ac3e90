"""CompositeOpsFusionPass: fused groups absorb reductions, expensive elementwise ops and neighbours."""

from __future__ import annotations

from fusiontune.ir.ops import get_op
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


def _pattern(part: Partition, gid: int) -> str:
    kinds = {get_op(op).kind for op in part.ops(gid)}
    return "ReduceElemwiseFusion" if "reduction" in kinds else "ElemwiseCompositeFusion"


@patterns("ElemwiseCompositeFusion", "ReduceElemwiseFusion")
def composite_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Merge loop-nest groups with their producer and consumer groups while one kernel can hold them.

    This is MindSpore's composite stage (seed 001): an existing fused group absorbs a neighbouring
    op (NetCompositeFuse's Pow), and a reduction takes its elementwise prologue and epilogue
    (a LayerNorm with the residual add before it and the scale after it). Identity: as for basic
    fusion, each value is computed by the same operations; a reduction's prologue is recomputed in
    each round over data that is in cache instead of being stored. Preconditions: a single loop
    domain (all reductions over the same axes of the same shape), no barrier between the groups,
    and an acyclic group DAG.
    """
    part = Partition(fused)
    changed = True
    while changed:
        changed = False
        for gid in part.group_ids():
            if gid not in part.members or part.kind(gid) != "loop":
                continue
            for succ in sorted(part.successors(gid)):
                if succ in part.members and part.kind(succ) == "loop" and part.try_merge(gid, succ) is not None:
                    changed = True
    return commit(part, ctx, "CompositeOpsFusionPass", _pattern)
