"""FlashAttentionFusionPass: matches in the built-in blocks and by hand, preconditions, deny, split point."""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import BY_NAME, PASSES, lookup
from fusiontune.runtime import build_program
from fusiontune.workloads.builtin import make_workload

PASS = "FlashAttentionFusionPass"
SMALL = {"batch": 1, "seq": 16, "hidden": 32, "heads": 2}


def fuse(graph: Graph, deny: dict[str, frozenset[int]] | None = None, kv_block: int = 0) -> PipelineResult:
    """Only the canonicalization, SoftmaxFusionPass and this pass."""
    config = FusionConfig.resolve(
        all_switch={"GraphFusion": False, "UBFusion": False},
        explicit={"SoftmaxFusionPass": True, PASS: True},
        split_points={f"{PASS}.kv_block": kv_block},
    )
    return run_pipeline(graph, config, deny=deny)


def assert_same_outputs(before: Graph, after: Graph) -> None:
    inputs = random_inputs(before, seed=0)
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12, err_msg=name)


def attention_net(
    g: GraphBuilder, *, k_given_transposed: bool = False, div: bool = False, mask: bool = True, leak: bool = False
) -> Tensor | tuple[Tensor, ...]:
    q = g.input("q", (2, 3, 5, 4))
    v = g.input("v", (2, 3, 7, 6))
    if k_given_transposed:
        kt = g.input("kt", (2, 3, 4, 7))  # k^T as any tensor: the pass inserts a Transpose
    else:
        kt = g.transpose(g.input("k", (2, 3, 7, 4)), (0, 1, 3, 2))
    s = g.matmul(q, kt)
    s = g.div(s, 2.0) if div else g.mul(s, 0.5)
    if mask:
        s = g.add(g.input("mask", (2, 1, 1, 7)), s)  # the mask on the left: either order matches
    p = g.softmax_decomposed(s)
    out = g.matmul(p, v)
    return (out, g.reduce_sum(s)) if leak else out


def build(**kw: bool) -> Graph:
    g = GraphBuilder("attn", dtype="float64")
    out = attention_net(g, **kw)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


# ---- the registry row -----------------------------------------------------------------------------
def test_registry_row_runs_after_softmax_fusion_with_mindspore_aliases() -> None:
    names = [p.name for p in PASSES]
    info = BY_NAME[PASS]
    assert names.index(PASS) > names.index("SoftmaxFusionPass")
    assert info.stage == BY_NAME["SoftmaxFusionPass"].stage == "graph"
    assert info.default and info.exact and info.switchable
    assert lookup("FlashAttentionFusionV1") is info and lookup("FlashAttentionFusionV2") is info
    (sp,) = info.split_points
    assert sp.name == "kv_block" and sp.choices == (0, 32, 64, 128)


# ---- matches ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["transformer_block", "llama_block"])
def test_matches_the_attention_of_the_builtin_blocks(name: str) -> None:
    w = make_workload(name, **SMALL, ffn=48)
    result = run_pipeline(w.graph, FusionConfig.defaults())
    after = result.fused.graph
    ops = after.op_counts()
    assert ops.get("Attention") == 1 and "Softmax" not in ops
    (node,) = [n for n in after.nodes if n.op == "Attention"]
    assert len(node.inputs) == (4 if name == "llama_block" else 3)  # the causal mask
    assert node.attrs["scale"] == pytest.approx(1 / np.sqrt(SMALL["hidden"] // SMALL["heads"]))
    line = f"GraphFusionPass[{PASS}]: pattern=FlashAttention, matched_times=1, effected_times=1"
    assert line in result.report.log_lines()
    # k^T was Transpose(reshape(k), (0, 2, 3, 1)): it becomes one Transpose (0, 2, 1, 3) to (B, h, S, d).
    k_producer = next(n for n in after.nodes if node.inputs[1] in n.outputs)
    assert k_producer.op == "Transpose" and tuple(k_producer.attrs["perm"]) == (0, 2, 1, 3)


def test_matches_by_hand_and_absorbs_the_transpose_of_k() -> None:
    graph = build()
    result = fuse(graph)
    after = result.fused.graph
    assert after.op_counts() == {"Attention": 1}
    (node,) = after.nodes
    assert node.inputs == ("q", "k", "v", "mask") and node.attrs["scale"] == 0.5
    assert sorted(node.origin) == sorted(n.name for n in graph.nodes)
    assert_same_outputs(graph, after)


def test_k_transposed_given_directly_gets_a_transpose() -> None:
    graph = build(k_given_transposed=True, div=True, mask=False)
    after = fuse(graph).fused.graph
    assert after.op_counts() == {"Attention": 1, "Transpose": 1}
    t = next(n for n in after.nodes if n.op == "Transpose")
    assert t.inputs == ("kt",) and tuple(t.attrs["perm"]) == (0, 1, 3, 2)
    att = next(n for n in after.nodes if n.op == "Attention")
    assert att.attrs["scale"] == 0.5 and len(att.inputs) == 3  # Div by 2 is scale 1/2; no mask
    assert_same_outputs(graph, after)


def test_not_matched_when_an_intermediate_has_another_reader() -> None:
    graph = build(leak=True)  # the scaled scores are also summed and exported
    result = fuse(graph)
    assert result.report.matched(PASS) == 0
    assert "Attention" not in result.fused.graph.op_counts()


def test_denied_application_leaves_the_graph() -> None:
    graph = build()
    result = fuse(graph, deny={PASS: frozenset({0})})
    assert result.report.matched(PASS) == 1 and result.report.effected(PASS) == 0
    assert [a.applied for a in result.report.applications if a.pass_name == PASS] == [False]
    assert "Attention" not in result.fused.graph.op_counts()
    assert result.fused.graph.op_counts()["Softmax"] == 1


def test_kv_block_split_point_reaches_the_node() -> None:
    after = fuse(build(), kv_block=64).fused.graph
    (node,) = after.nodes
    assert node.attrs["kv_block"] == 64


# ---- end to end -------------------------------------------------------------------------------------
def test_transformer_block_end_to_end_within_its_bound() -> None:
    """The shipped space's bound (search_spaces/transformer_block.toml: max_rel 5e-4), defaults
    with kv_block 32 over seq 64, against the float64 reference; two kernels fewer than without."""
    w = make_workload("transformer_block", batch=1, seq=64, hidden=64, heads=2, ffn=128)
    on = FusionConfig.resolve(split_points={f"{PASS}.kv_block": 32})
    fused = run_pipeline(w.graph, on).fused
    prog = build_program(fused)
    off = build_program(run_pipeline(w.graph, FusionConfig.defaults().with_switches(**{PASS: False})).fused)
    assert prog.kernel_count == off.kernel_count - 2
    out = prog.run(w.inputs)
    for name, want in w.reference.items():
        floor = 1e-3 * np.max(np.abs(want))
        rel = np.max(np.abs(out[name] - want) / np.maximum(np.abs(want), floor))
        assert rel <= 5e-4, (name, rel)
