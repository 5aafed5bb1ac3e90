"""ConvConcatFusionPass: Conv kernels write their results into their Concat's buffer (no copy)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.codegen.plan import check_fusable, group_io
from fusiontune.ir.ops import normalize_axis
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.passes.graph._match import effective_attrs
from fusiontune.passes.pipeline import patterns

IN_PLACE = "concat_in_place"
"""Schedule key of a Concat group whose inputs were written in place: it runs no kernel
(:func:`fusiontune.runtime.program.concat_in_place`)."""
INTO = "concat_into"
"""Schedule keys of a conv group that writes into a Concat's output: the value, the channel
offset of its part and the output's channel count (codegen/conv.py ``generate_conv_kernel``)."""
OFFSET = "concat_offset"
CHANNELS = "concat_channels"


@patterns("ConvConcat")
def conv_concat_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Let the Conv kernels that make a channel Concat's parts write them into its output.

    An Inception or SqueezeNet "fire" module concatenates the outputs of parallel convs along the
    channels; unfused, each conv writes its own buffer and a layout kernel copies both into the
    concatenation. Here each conv kernel's epilogue stores its channels ``m`` at ``m + offset`` of
    the Concat's output, and the Concat runs no kernel. Identity: every element is the same value
    at the same index of the Concat's output; only the copy is gone. CANN's ConvConcatFusionPass
    does this on the device (a GraphFusion switch there; a UBFusion one here, as ReshapeRemovePass,
    because it marks the final kernels rather than rewriting the graph). Preconditions: the
    Concat is along axis 1 (NCHW channels); every part is the one exported output of a group
    holding a Conv (its epilogue included), read by nothing but this Concat, no graph output, and
    appears once; the conv kernel takes the target (:func:`~fusiontune.codegen.plan.check_fusable`
    with the new schedule).
    """
    graph = fused.graph
    outputs = set(graph.outputs)
    readers = graph.consumers()
    producer = {o: g for g in fused.groups for n in g.nodes for o in graph.node(n).outputs}
    changed: dict[str, Group] = {}
    for g in fused.groups:
        if len(g.nodes) != 1 or g.schedule.get(IN_PLACE):
            continue
        node = graph.node(g.nodes[0])
        if node.op != "Concat" or len(node.inputs) < 2 or len(set(node.inputs)) != len(node.inputs):
            continue
        out = graph.values[node.outputs[0]]
        if len(out.shape) < 3 or normalize_axis(effective_attrs(node)["axis"], len(out.shape)) != 1:
            continue
        planned: list[tuple[Group, dict[str, object]]] = []
        offset = 0
        for part in node.inputs:
            src = producer.get(part)
            value = graph.values[part]
            if (
                src is None
                or src.name in changed
                or INTO in src.schedule
                or part in outputs
                or readers[part] != [node]
                or value.dtype != out.dtype
                or not any(graph.node(n).op == "Conv" for n in src.nodes)
                or any(graph.node(n).op == "ConvTranspose" for n in src.nodes)
                or group_io(graph, src.nodes)[1] != [part]
            ):
                break
            sched = {**src.schedule, INTO: out.name, OFFSET: offset, CHANNELS: out.shape[1]}
            if check_fusable(graph, src.nodes, sched) is not None:
                break
            planned.append((src, sched))
            offset += value.shape[1]
        else:
            if not ctx.allow("ConvConcat", node.origin):
                continue
            for src, sched in planned:
                changed[src.name] = replace(src, schedule=sched, passes=(*src.passes, "ConvConcatFusionPass"))
            changed[g.name] = replace(g, schedule={**g.schedule, IN_PLACE: 1}, passes=(*g.passes, "ConvConcatFusionPass"))
    if not changed:
        return fused
    return fused.with_groups(changed.get(g.name, g) for g in fused.groups)
