"""TbeMultiOutputFusionPass: siblings that read the same input become one multi-output kernel."""

from __future__ import annotations

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


@patterns("TbeMultiOutputFusion")
def multi_output_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Merge loop-nest groups that read a common non-constant input into one kernel.

    Identity: two independent loops over the same domain equal one loop computing both outputs;
    the shared input is read from memory once instead of twice. Preconditions: neither group
    depends on the other (directly or through a third group), and one loop domain holds both.
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
    return commit(part, ctx, "TbeMultiOutputFusionPass", lambda p, g: "TbeMultiOutputFusion")
