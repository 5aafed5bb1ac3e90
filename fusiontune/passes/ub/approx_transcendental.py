"""ApproxTranscendentalFusionPass: kernels evaluate exp / tanh / sigmoid / erf approximately (inexact)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns

PASS_NAME = "ApproxTranscendentalFusionPass"

TRANSCENDENTAL_OPS = frozenset(
    {"Exp", "Tanh", "Sigmoid", "Silu", "SwiGlu", "Gelu", "Erf", "Softmax", "Attention"}
)
"""Ops whose lowering calls exp, tanh, sigmoid or erf (Softmax and Attention through their exp)."""

EXP_OPS = frozenset({"Exp", "Sigmoid", "Silu", "SwiGlu", "Softmax", "Attention"})
"""Those of :data:`TRANSCENDENTAL_OPS` that compute exp only: in float32 the default math already
evaluates exp as the approximation does (codegen/rules.py ``_exp``), so the pass changes them in
float64 kernels only."""


def changes(op: str, dtype: str) -> bool:
    """Whether ``math="approx"`` changes how a node ``op`` of ``dtype`` is computed."""
    return op in TRANSCENDENTAL_OPS and (op not in EXP_OPS or dtype != "float32")


@patterns("ApproxTranscendental")
def approx_transcendental_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Let each kernel that computes exp / tanh / sigmoid / erf use fast approximations.

    Identity, approximate: every group (kernel) that holds a Tanh, Gelu or Erf, or in float64 one of
    Exp, Sigmoid, Silu, SwiGlu, Softmax or Attention (:func:`changes`), gets
    ``schedule["math"] = "approx"``, and codegen evaluates those functions with cheaper float32
    polynomial / range-reduction forms in place of the float64 ones or the libm calls (the
    fast-math intrinsics of Ascend's vector unit and of CUDA's ``__expf``). Nothing else in the
    kernel changes; groups without such an op are not touched. A float32 exp is the same under
    either math (the default computes it with the same approximation since 2026-11-28, within one
    ulp of the correctly rounded exp),
    so a float32 group whose only transcendental is an exp is left alone.

    Error: each function is within a few float32 ulps (``fusiontune/codegen/numerics.py``,
    measured over every float32 in range: exp 8.5e-8 relative, tanh 2.9e-7 absolute, erf 4.4e-7
    absolute, sigmoid 1.5e-7 relative). Where the result is a small difference of such values
    the relative error grows: erf-GELU for x < -3 computes ``1 + erf(x)`` with erf near -1, which
    gave 5.9e-5 max_rel (relative to ``max(|ref|, 1e-3 max|ref|)``) against libm's 5.3e-6 in
    ``benchmarks/bench_approx.py``. The registry declares ``expected_error = 1e-4`` for that
    worst case; softmax, SiLU and tanh stay at the float32 floor (a few 1e-7).

    Preconditions: none on the graph; runs after grouping (stage ``precision``), one application
    per eligible group in group order, so application indices are stable when some are denied.
    """
    graph = fused.graph
    groups = []
    for g in fused.groups:
        nodes = [graph.node(n) for n in g.nodes]
        if any(changes(n.op, graph.values[n.outputs[0]].dtype) for n in nodes):
            origins = [o for n in nodes for o in n.origin]
            if ctx.allow("ApproxTranscendental", origins):
                g = replace(
                    g, schedule={**g.schedule, "math": "approx"}, passes=(*g.passes, PASS_NAME)
                )
        groups.append(g)
    return fused.with_groups(groups)
