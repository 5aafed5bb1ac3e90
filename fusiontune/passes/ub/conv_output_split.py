"""ConvOutputSplitFusionPass: how a Conv kernel cuts its output (split points ``rows``, ``algo``)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns

ALGOS = {1: "im2col", 2: "direct", 3: "shifted", 4: "packed", 5: "plane", 6: "chan", 7: "axpy"}
ORIENTS = {1: "rows", 2: "lanes"}


@patterns("ConvOutputSplit")
def conv_output_split_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Set the output block of each Conv kernel and, optionally, its algorithm.

    CANN's split fusion: the Conv is split into blocks of ``rows`` output rows (X1..Xn), each
    computed by one GEMM over its patches and each fused with the epilogue while the block is in
    cache. Identity: every output element is the same dot product over the same patch, whatever
    block holds it, exactly. ``rows = 0`` leaves the kernel's own sizing (patch matrix within L2).
    ``algo``: 0 the codegen rule (codegen/conv.py ``choose_conv_algo``), 1 im2col + GEMM, 2 the
    direct loop kernel, 3 shifted-view GEMMs, 4 packed weights + the register-blocked
    micro-kernel, 5 the padded-plane kernel, 6 the channels-last kernel (both for depthwise convs;
    codegen/conv.py), 7 the scaled-rows kernel of 1x1 convs with short reductions; they sum the same products in a different order (rounding only). Preconditions: none beyond a Conv in the kernel; ``rows`` only changes
    im2col, shifted and packed kernels.
    """
    rows, algo, orient = ctx.split("rows"), ctx.split("algo"), ctx.split("orient")
    if rows <= 0 and algo <= 0 and orient <= 0:
        return fused
    graph = fused.graph
    groups = []
    for g in fused.groups:
        if any(graph.node(n).op == "Conv" for n in g.nodes):
            origins = [o for n in g.nodes for o in graph.node(n).origin]
            if ctx.allow("ConvOutputSplit", origins):
                sched = dict(g.schedule)
                if rows > 0:
                    sched["conv_rows"] = rows
                if algo in ALGOS:
                    sched["conv_algo"] = ALGOS[algo]
                if orient in ORIENTS:
                    sched["conv_orient"] = ORIENTS[orient]
                g = replace(g, schedule=sched, passes=(*g.passes, "ConvOutputSplitFusionPass"))
        groups.append(g)
    return fused.with_groups(groups)
