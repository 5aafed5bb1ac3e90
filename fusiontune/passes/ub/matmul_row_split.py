"""MatMulRowSplitFusionPass: MatMul in row blocks with the epilogue per block (split point ``row_block``)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns


@patterns("MatMulRowSplit")
def matmul_row_split_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Split each MatMul that has a fused epilogue into blocks of ``row_block`` rows.

    CANN's split fusion: op X (the MatMul) is split into X1..Xn (row blocks), and each block fuses
    with the epilogue, so the product of a block is consumed while it is in cache instead of being
    written to memory and read back. Identity: ``(A @ B)[r0:r1] == A[r0:r1] @ B``, exactly (each
    output element is the same dot product). ``row_block = 0`` means no split. Preconditions: the
    MatMul kernel has an epilogue (a bias or fused elementwise ops); without one a split only adds
    BLAS calls.
    """
    rows = ctx.split("row_block")
    if rows <= 0:
        return fused
    graph = fused.graph
    groups = []
    for g in fused.groups:
        ops = [graph.node(n).op for n in g.nodes]
        mm = [graph.node(n) for n in g.nodes if graph.node(n).op == "MatMul"]
        has_epilogue = len(ops) > 1 or (mm and len(mm[0].inputs) == 3)
        if mm and has_epilogue:
            origins = [o for n in g.nodes for o in graph.node(n).origin]
            if ctx.allow("MatMulRowSplit", origins):
                g = replace(g, schedule={**g.schedule, "row_block": rows}, passes=(*g.passes, "MatMulRowSplitFusionPass"))
        groups.append(g)
    return fused.with_groups(groups)
