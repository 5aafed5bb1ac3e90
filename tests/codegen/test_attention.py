"""The flash-attention kernel (codegen/attention.py) against the float64 reference of Attention.

A grid of shapes, key blocks, query blocks and masks (none, causal, padding, -inf), Dv != D, Sk
not a multiple of the key block; rows masked everywhere (NaN, as the reference); the exact skip of
masked key blocks (and no skip where V holds an inf); ``math="approx"``; float64.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fusiontune.codegen.plan import kernel_source
from fusiontune.ir import Graph, GraphBuilder, run_graph
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.runtime import build_program

RTOL, ATOL = 2e-5, 2e-6


def attention_graph(
    b: int, h: int, sq: int, sk: int, d: int, dv: int, mask: str, kv_block: int, dtype: str = "float32"
) -> Graph:
    g = GraphBuilder("attention", dtype=dtype)
    ins = [g.input("q", (b, h, sq, d)), g.input("k", (b, h, sk, d)), g.input("v", (b, h, sk, dv))]
    if mask in ("causal", "causal_inf"):
        fill = -1e9 if mask == "causal" else -np.inf
        ins.append(g.const(np.triu(np.full((sq, sk), fill), k=1 + sk - sq).astype(dtype)))
    elif mask == "padding":
        ins.append(g.input("mask", (b, 1, 1, sk)))
    g.output(g.op("Attention", *ins, scale=1.0 / np.sqrt(d), kv_block=kv_block))
    return g.build()


def run_kernel(graph: Graph, inputs: dict[str, np.ndarray], **schedule: object) -> np.ndarray:
    fused = FusedGraph.singletons(graph)
    fused = fused.with_groups([replace(grp, schedule=schedule) for grp in fused.groups])
    prog = build_program(fused)
    assert prog.kernel_count == 1
    return np.array(prog.run(inputs)[graph.outputs[0]], copy=True)


def make_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {n: rng.standard_normal(graph.values[n].shape).astype(graph.values[n].dtype) for n in graph.inputs}
    if "mask" in out:  # padding: the last keys of batch 0, half the keys of the last batch
        m = np.zeros_like(out["mask"])
        sk = m.shape[-1]
        m[0, ..., sk - 3 :] = -1e9
        m[-1, ..., sk // 2 :] = -np.inf
        out["mask"] = m
    return out


def check(graph: Graph, rtol: float = RTOL, atol: float = ATOL, **schedule: object) -> np.ndarray:
    inputs = make_inputs(graph)
    got = run_kernel(graph, inputs, **schedule)
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    return got


GRID = [
    # (b, h, sq, sk, d, dv, mask, kv_block)
    (2, 3, 16, 16, 8, 8, "", 0),
    (2, 3, 16, 16, 8, 8, "", 4),
    (1, 2, 40, 40, 16, 16, "causal", 16),
    (1, 2, 40, 40, 16, 16, "causal", 0),
    (1, 2, 40, 40, 16, 16, "causal_inf", 7),
    (1, 2, 24, 37, 16, 16, "causal", 8),  # Sq < Sk: the mask's diagonal is offset
    (2, 2, 33, 50, 8, 12, "padding", 16),  # Dv != D, Sk % kv_block != 0
    (2, 2, 33, 50, 8, 12, "padding", 0),
    (1, 1, 70, 129, 32, 8, "causal", 64),
    (1, 1, 3, 5, 4, 4, "", 64),  # a key block larger than Sk
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(map(str, c)).replace("--", "-nomask-"))
def test_attention_kernel_matches_float64_reference(case: tuple) -> None:
    check(attention_graph(*case))


@pytest.mark.parametrize("q_block", [1, 5, 7, 16])
def test_attention_query_block_schedule_changes_the_kernel_not_the_result(q_block: int) -> None:
    graph = attention_graph(2, 2, 33, 40, 8, 8, "causal", 8)
    default = kernel_source(graph, [n.name for n in graph.nodes]).source
    assert kernel_source(graph, [n.name for n in graph.nodes], {"q_block": q_block}).source != default
    check(graph, q_block=q_block)


def test_attention_kv_block_changes_the_kernel() -> None:
    names = lambda g: [n.name for n in g.nodes]  # noqa: E731
    sources = {kb: kernel_source(g, names(g)).source for kb in (0, 16, 32) for g in [attention_graph(1, 2, 40, 40, 16, 16, "causal", kb)]}
    assert len(set(sources.values())) == 3


def test_attention_fully_masked_row_is_nan_like_the_reference() -> None:
    """Scores all -inf: the reference computes -inf - -inf = NaN; so does the kernel (0 / 0)."""
    graph = attention_graph(2, 1, 6, 10, 4, 4, "padding", 4)
    inputs = make_inputs(graph)
    inputs["mask"][1] = -np.inf
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    got = run_kernel(graph, inputs)
    assert np.isnan(want[1]).all() and np.isfinite(want[0]).all()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)


def test_attention_kernel_with_skipped_blocks_matches_the_reference() -> None:
    """Causal -inf mask, key blocks of 8: the kernel has the skip test, and the blocks above the
    diagonal it skips change nothing against the reference. (A bit-for-bit comparison with a
    kernel that computes them is not made here.)"""
    graph = attention_graph(1, 2, 64, 64, 16, 16, "causal_inf", 8)
    assert "negligible" in kernel_source(graph, [n.name for n in graph.nodes]).source
    check(graph)


def test_attention_inf_in_masked_values_still_poisons_like_the_reference() -> None:
    """0 * inf is NaN in the reference's P @ V: a key block whose V holds an inf is never skipped."""
    graph = attention_graph(1, 1, 16, 16, 4, 4, "causal", 4)
    inputs = make_inputs(graph)
    inputs["v"][0, 0, 15, 0] = np.inf  # key 15: masked for every query but the last
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    got = run_kernel(graph, inputs)
    assert np.isnan(want[0, 0, :15, 0]).all()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)


def test_attention_approx_math_uses_exp_approx_and_stays_close() -> None:
    graph = attention_graph(2, 2, 48, 48, 16, 16, "causal", 16)
    assert "exp_approx(" in kernel_source(graph, [n.name for n in graph.nodes], {"math": "approx"}).source
    check(graph, rtol=1e-4, atol=1e-5, math="approx")


def test_attention_float64_kernel_is_float64_accurate() -> None:
    check(attention_graph(1, 2, 20, 30, 8, 6, "padding", 8, dtype="float64"), rtol=1e-12, atol=1e-13)


def test_attention_with_a_scalar_mask_constant() -> None:
    g = GraphBuilder("scalar_mask")
    q, k, v = (g.input(n, (1, 4, 8)) for n in "qkv")
    g.output(g.op("Attention", q, k, v, g.const(np.float32(0.5)), scale=0.3, kv_block=3))
    check(g.build())
