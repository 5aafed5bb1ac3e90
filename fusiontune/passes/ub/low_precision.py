"""LowPrecisionFusionPass / LowPrecisionBf16FusionPass: loop-nest kernels compute in 16 bits (inexact)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.codegen.rules import CONTRACTION_OPS, LAYOUT_OPS
from fusiontune.ir.graph import Graph
from fusiontune.ir.ops import get_op
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.passes.pipeline import patterns

WIDE_FLOATS = ("float32", "float64")


def eligible(graph: Graph, group: Group) -> bool:
    """A loop-nest kernel with float work to narrow.

    True when the group has no MatMul and no layout op (Reshape / Transpose / Concat / Split /
    Slice: those groups are contraction or layout kernels), and at least one of its elementwise
    or reduction nodes reads or writes a float32 or float64 value.
    """
    nodes = [graph.node(n) for n in group.nodes]
    if any(n.op in CONTRACTION_OPS or n.op in LAYOUT_OPS for n in nodes):
        return False
    return any(
        get_op(n.op).kind in ("elementwise", "reduction")
        and any(graph.values[v].dtype in WIDE_FLOATS for v in (*n.inputs, *n.outputs))
        for n in nodes
    )


def _mark(fused: FusedGraph, ctx: PassContext, precision: str, pass_name: str) -> FusedGraph:
    graph = fused.graph
    groups = []
    for g in fused.groups:
        if "precision" not in g.schedule and eligible(graph, g):
            origins = [o for n in g.nodes for o in graph.node(n).origin]
            if ctx.allow("LowPrecision", origins):
                g = replace(
                    g,
                    schedule={**g.schedule, "precision": precision},
                    passes=(*g.passes, pass_name),
                )
        groups.append(g)
    return fused.with_groups(groups)


@patterns("LowPrecision")
def low_precision_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Run each loop-nest kernel in float16 (MindSpore's ``enable_low_precision``).

    Identity, approximate: every group without a MatMul or a layout op (a loop-nest kernel) that has
    float work gets ``schedule["precision"] = "float16"``: codegen rounds every value the kernel
    loads, computes and stores to float16, and its reductions accumulate in float32. The
    graph's values keep their dtypes; the rounding is the kernel's.

    Error: float16's unit roundoff, 2^-11 = 4.9e-4, relative per rounding (each load, each op,
    each store); the registry declares ``expected_error = 4.9e-4`` per op, and a chain of k ops
    accumulates up to about k times that. float16's range (max 65504, normal min 6.1e-5) is narrower
    than float32's: values beyond it overflow to inf, tiny ones lose precision.

    Preconditions: none on the graph; one application per eligible group, in group order (stable
    indices when some are denied). A group already given a precision is skipped.
    """
    return _mark(fused, ctx, "float16", "LowPrecisionFusionPass")


@patterns("LowPrecision")
def low_precision_bf16_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Run each loop-nest kernel in bfloat16 (``enable_low_precision`` with bfloat16).

    Identity, approximate: as LowPrecisionFusionPass, with ``schedule["precision"] = "bfloat16"``: every
    value the kernel loads, computes and stores is rounded to bfloat16 (float32's 8-bit exponent,
    8-bit significand), reductions accumulate in float32. float32's range is kept.

    Error: bfloat16's unit roundoff, 2^-8 = 3.9e-3, relative per rounding; the registry declares
    ``expected_error = 3.9e-3`` per op, and a chain accumulates.

    Preconditions: as LowPrecisionFusionPass. It runs after it: when both are on, groups that
    LowPrecisionFusionPass marked float16 stay float16 and this pass skips them (no application);
    a group whose float16 application was denied is unmarked, so this pass may mark it bfloat16.
    """
    return _mark(fused, ctx, "bfloat16", "LowPrecisionBf16FusionPass")
