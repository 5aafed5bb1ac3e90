"""ReshapeRemovePass: a Reshape kernel becomes a view of its input's buffer (no kernel runs)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns

VIEW = "view"
"""The schedule key the runtime reads (:func:`fusiontune.runtime.program.reshape_views`)."""


@patterns("ReshapeView")
def reshape_remove(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Mark every kernel that is one Reshape as a view: the program runs no kernel for it.

    Identity: a Reshape of a C-contiguous buffer (every buffer of a program is one) reads and
    writes the same bytes in the same order, so its output *is* the input's buffer under the new
    shape; the copy is gone and the buffer lives while either name is read (the buffer plan
    extends it). GE's ReshapeRemovePass does this at graph level. Preconditions: the output is
    no graph output (outputs own their buffers) and keeps the input's dtype.
    """
    graph = fused.graph
    outputs = set(graph.outputs)
    groups = []
    for g in fused.groups:
        if len(g.nodes) == 1 and not g.schedule.get(VIEW):
            node = graph.node(g.nodes[0])
            out, src = node.outputs[0], node.inputs[0]
            if (
                node.op == "Reshape"
                and out not in outputs
                and graph.values[out].dtype == graph.values[src].dtype
                and ctx.allow("ReshapeView", node.origin)
            ):
                g = replace(g, schedule={**g.schedule, VIEW: 1}, passes=(*g.passes, "ReshapeRemovePass"))
        groups.append(g)
    return fused.with_groups(groups)
