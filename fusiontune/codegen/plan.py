"""Choose the kernel template for a group and generate its source.

A group with a MatMul is a contraction kernel, one with a Conv a conv kernel (codegen/conv.py; it
may end with a MaxPool, ConvMaxPoolFusionPass); a single layout node is a layout kernel, a single
MaxPool / AveragePool a window kernel (codegen/pool.py); anything else is a loop nest. UBFusion passes ask :func:`check_fusable` before
they merge groups, so every group they form is one that a template can run as one kernel.

A group's ``schedule`` carries codegen hints: ``row_block`` and ``matmul_algo`` (contractions), ``conv_algo`` and
``conv_rows`` (conv kernels), ``math="approx"`` (vectorizable exp / tanh / erf,
codegen/numerics.py) and ``precision="float16"|"bfloat16"`` (low-precision emulation in loop
nests); see :func:`kernel_source`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fusiontune.codegen.attention import generate_attention_kernel
from fusiontune.codegen.attention_grad import generate_attention_grad_kernel
from fusiontune.codegen.common import KernelSource, NotFusable, lower_group
from fusiontune.codegen.contraction import generate_contraction_kernel
from fusiontune.codegen.conv import generate_conv_kernel
from fusiontune.codegen.conv_transpose import generate_conv_transpose_kernel
from fusiontune.codegen.layout import generate_layout_kernel
from fusiontune.codegen.loopnest import generate_loop_kernel
from fusiontune.codegen.pool import generate_pool_kernel
from fusiontune.codegen.rotary import generate_rotary_kernel
from fusiontune.codegen.rules import (
    ATTENTION_OPS,
    LAYOUT_OPS,
    LOW_PRECISIONS,
    MATH_MODES,
    OPAQUE_OPS,
    PRECISIONS,
    WINDOW_OPS,
)
from fusiontune.ir.graph import Graph
from fusiontune.passes.fused_graph import FusedGraph, Group

KERNEL_NAME = "kernel"


def group_io(graph: Graph, node_names: Sequence[str], readers_outside: dict[str, bool] | None = None) -> tuple[list[str], list[str]]:
    """External inputs (non-scalar) and exported outputs of a set of nodes."""
    inside = set(node_names)
    produced: dict[str, None] = {}
    for n in node_names:
        for o in graph.node(n).outputs:
            produced[o] = None
    ins: dict[str, None] = {}
    for n in node_names:
        node = graph.node(n)
        for k, i in enumerate(node.inputs):
            if i not in produced:
                arr = graph.constants.get(i)
                # One-element constants become literals, except a MatMul's matrices (a 1x1 weight)
                # and a Conv's operands (a 1x1x1x1 weight, a bias of one channel).
                operand = (node.op == "MatMul" and k < 2) or node.op == "Conv"
                if arr is not None and arr.size == 1 and arr.dtype.kind in "fib" and not operand:
                    continue
                ins[i] = None
    outside = {i for n in graph.nodes if n.name not in inside for i in n.inputs}
    outs = [o for o in produced if o in outside or o in graph.outputs]
    return list(ins), outs


def kernel_source(graph: Graph, node_names: Sequence[str], schedule: Mapping[str, Any] | None = None) -> KernelSource:
    """Generate the kernel for a set of nodes of ``graph``.

    ``schedule`` keys read here: ``row_block`` (contraction kernels), ``math`` (``libm`` or
    ``approx``: transcendentals as vectorizable approximations, loop nests and contraction
    epilogues) and ``precision`` (``float32``, ``float16`` or ``bfloat16``: low-precision emulation,
    loop nests only). Layout kernels move data and ignore them.

    Raises:
        NotFusable: no template runs these nodes as one kernel.
        ValueError: an unknown ``math`` or ``precision`` value.
    """
    schedule = schedule or {}
    math_mode = schedule.get("math") or "libm"
    precision = schedule.get("precision") or "float32"
    if math_mode not in MATH_MODES:
        raise ValueError(f"schedule math={math_mode!r}: expected one of {MATH_MODES}")
    if precision not in PRECISIONS:
        raise ValueError(f"schedule precision={precision!r}: expected one of {PRECISIONS}")
    approx = math_mode == "approx"
    low_precision = precision if precision in LOW_PRECISIONS else None
    inputs, outputs = group_io(graph, node_names)
    if not outputs:
        raise NotFusable("the group produces nothing anyone reads")
    ops = [graph.node(n).op for n in node_names]
    if any(op in LAYOUT_OPS for op in ops):
        if len(node_names) != 1:
            raise NotFusable("layout ops run as kernels of their own")
        node = graph.node(node_names[0])
        return generate_layout_kernel(node, dict(graph.values), KERNEL_NAME)
    if any(op in WINDOW_OPS for op in ops) and "Conv" not in ops:  # a Conv's kernel may end with a MaxPool
        if len(node_names) != 1:
            raise NotFusable("pooling ops run as kernels of their own")
        return generate_pool_kernel(graph.node(node_names[0]), dict(graph.values), KERNEL_NAME)
    if any(op in OPAQUE_OPS for op in ops):
        if len(node_names) != 1:
            raise NotFusable(f"{', '.join(o for o in ops if o in OPAQUE_OPS)} runs as a kernel of its own")
        return generate_rotary_kernel(graph.node(node_names[0]), dict(graph.values), KERNEL_NAME)
    if "ConvTranspose" in ops:
        if len(node_names) != 1:
            raise NotFusable("ConvTranspose runs as a kernel of its own (bias included)")
        return generate_conv_transpose_kernel(graph.node(node_names[0]), dict(graph.values), KERNEL_NAME)
    low = lower_group(graph, node_names, outputs)
    if "AttentionGrad" in ops:
        return generate_attention_grad_kernel(low, inputs, outputs, KERNEL_NAME, approx)
    if any(op in ATTENTION_OPS for op in ops):
        # One Attention node alone (codegen/attention.py); ``q_block`` sets its query rows per task.
        return generate_attention_kernel(low, inputs, outputs, KERNEL_NAME, int(schedule.get("q_block", 0)), approx)
    if "Conv" in ops:
        return generate_conv_kernel(low, inputs, outputs, KERNEL_NAME, schedule, approx)
    if "MatMul" in ops:
        return generate_contraction_kernel(low, inputs, outputs, KERNEL_NAME, int(schedule.get("row_block", 0)), approx,
                                           str(schedule.get("matmul_algo", "")))
    return generate_loop_kernel(low, inputs, outputs, KERNEL_NAME, approx, low_precision)


def check_fusable(graph: Graph, node_names: Sequence[str], schedule: Mapping[str, Any] | None = None) -> str | None:
    """None when the nodes make one kernel, else the reason they do not."""
    try:
        kernel_source(graph, node_names, schedule)
    except NotFusable as exc:
        return str(exc)
    return None


def group_sources(fused: FusedGraph) -> list[tuple[Group, KernelSource]]:
    """Kernel source for every group, in execution order."""
    return [(g, kernel_source(fused.graph, g.nodes, dict(g.schedule))) for g in fused.groups]
