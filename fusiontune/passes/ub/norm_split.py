"""NormSplitFusionPass: cut a normalization between its statistics and its elementwise part."""

from __future__ import annotations

from fusiontune.ir.expand import EXPANDABLE, expand
from fusiontune.ir.graph import GraphEditor
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns


@patterns("NormSplit")
def norm_split_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Split each Softmax / LayerNorm / RMSNorm (and the Add+norm ops) into X1 and X2 (``stats = 1``).

    CANN's split fusion model: op X becomes X1 (the per-row statistics: max and sum, or mean and
    rstd) and X2 (the elementwise normalization), and a barrier keeps them in different kernels,
    so X1 fuses with its producer A (a residual add) and X2 with its consumers B, C (a scale, an
    activation). Identity: the op's expansion (ir/expand.py) equals its reference up to rounding,
    and the split only stores the per-row statistics between the two kernels. ``stats = 0`` means
    no split. Runs before UB grouping, on a graph of singletons.
    """
    if ctx.split("stats") <= 0:
        return fused
    graph = fused.graph
    ed = GraphEditor(graph)
    barriers: set[tuple[str, str]] = set(fused.barriers)
    for node in graph.nodes:
        if node.op not in EXPANDABLE:
            continue
        if node.op == "Softmax" and node.attr("axis", -1) not in (-1, len(graph.values[node.inputs[0]].shape) - 1):
            continue
        if not ctx.allow("NormSplit", node.origin):
            continue
        e = expand(node, ed.values)
        ed.remove_nodes([node.name])
        for name, value in e.values.items():
            ed.values[name] = value
        for name, arr in e.constants.items():
            ed.constants[name] = arr
        for n in e.nodes:
            ed.add_node(n)
        barriers.update((s.name, a.name) for s in e.stats for a in e.apply)
    new_graph = ed.finish()
    live = {n.name for n in new_graph.nodes}
    return FusedGraph.singletons(new_graph, {(a, b) for a, b in barriers if a in live and b in live})
