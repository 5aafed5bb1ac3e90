"""TbeEltwiseFusionPass: basic fusion of simple elementwise ops (seed 001's first stage)."""

from __future__ import annotations

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


@patterns("TbeEltwiseFusion")
def eltwise_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Fuse chains and DAGs of *basic* elementwise ops into one kernel each.

    Identity: ``f(g(x))`` computed per element in one loop equals the two loops with the
    intermediate stored, exactly (same operations, same rounding); the intermediate never leaves
    registers. Preconditions: every op is a basic elementwise op (arithmetic, Relu, Where, Cast;
    Pow and the transcendentals wait for composite fusion, as in MindSpore's NetCompositeFuse), the
    merged group has one broadcast domain and the group DAG stays acyclic.
    """
    part = Partition(fused)
    for node in fused.graph.nodes:
        gid = part.owner[node.name]
        if not part.is_basic_eltwise(gid):
            continue
        for value in node.inputs:
            src = part.producer.get(value)
            if src is None:
                continue
            other = part.owner[src]
            if other != gid and part.is_basic_eltwise(other) and part.kind(other) == "loop":
                merged = part.try_merge(other, gid)
                if merged is not None:
                    gid = merged
    return commit(part, ctx, "TbeEltwiseFusionPass", lambda p, g: "TbeEltwiseFusion")
