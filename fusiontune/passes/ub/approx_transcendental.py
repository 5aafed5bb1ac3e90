"""ApproxTranscendentalFusionPass: kernels evaluate exp / tanh / sigmoid / erf approximately (inexact)."""

from __future__ import annotations

from dataclasses import replace

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns

PASS_NAME = "ApproxTranscendentalFusionPass"

TRANSCENDENTAL_OPS = frozenset(
    {"Exp", "Tanh", "Sigmoid", "Silu", "SwiGlu", "Gelu", "Erf", "Softmax"}
)
"""Ops whose lowering calls exp, tanh, sigmoid or erf (Softmax through its exp)."""


@patterns("ApproxTranscendental")
def approx_transcendental_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Let each kernel that computes exp / tanh / sigmoid / erf use fast approximations.

    Identity, approximate: every group (kernel) that holds one of Exp, Tanh, Sigmoid, Silu, SwiGlu, Gelu,
    Erf or Softmax gets ``schedule["math"] = "approx"``, and codegen evaluates those functions
    with cheaper polynomial / range-reduction forms in place of the libm calls (the fast-math
    intrinsics of Ascend's vector unit and of CUDA's ``__expf``). Nothing else in the kernel
    changes; groups without such an op are not touched.

    Error: about 1e-6 relative per evaluated function (a few float32 ulps). The registry declares
    ``expected_error = 2e-6``, a placeholder until the codegen's measured figures
    (``fusiontune/codegen/numerics.py``: ``EXP_MAX_REL`` and the others) replace it; a chain of
    such ops accumulates, and a Softmax's exp error passes through its normalization.

    Preconditions: none on the graph; runs after grouping (stage ``precision``), one application
    per eligible group in group order, so application indices are stable when some are denied.
    """
    graph = fused.graph
    groups = []
    for g in fused.groups:
        nodes = [graph.node(n) for n in g.nodes]
        if any(n.op in TRANSCENDENTAL_OPS for n in nodes):
            origins = [o for n in nodes for o in n.origin]
            if ctx.allow("ApproxTranscendental", origins):
                g = replace(
                    g, schedule={**g.schedule, "math": "approx"}, passes=(*g.passes, PASS_NAME)
                )
        groups.append(g)
    return fused.with_groups(groups)
