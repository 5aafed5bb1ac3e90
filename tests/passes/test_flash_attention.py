"""FlashAttentionFusionPass: matches in the built-in blocks and by hand, preconditions, deny, split point."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph, Node
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import BY_NAME, PASSES, lookup
from fusiontune.runtime import build_program
from fusiontune.workloads.builtin import make_workload

PASS = "FlashAttentionFusionPass"
SMALL = {"batch": 1, "seq": 16, "hidden": 32, "heads": 2}


def fuse(
    graph: Graph, deny: dict[str, frozenset[int]] | None = None, kv_block: int = 0
) -> PipelineResult:
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
    g: GraphBuilder,
    *,
    k_given_transposed: bool = False,
    div: bool = False,
    mask: bool = True,
    leak: bool = False,
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
    off = build_program(
        run_pipeline(w.graph, FusionConfig.defaults().with_switches(**{PASS: False})).fused
    )
    assert prog.kernel_count == off.kernel_count - 2
    out = prog.run(w.inputs)
    for name, want in w.reference.items():
        floor = 1e-3 * np.max(np.abs(want))
        rel = np.max(np.abs(out[name] - want) / np.maximum(np.abs(want), floor))
        assert rel <= 5e-4, (name, rel)


# ---- the spellings of real exports -------------------------------------------------------------
B, KVH, G, S, D = 2, 2, 3, 5, 4
H = KVH * G


def _graph(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]]) -> Graph:
    g = GraphBuilder("attn", dtype="float64")
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def _attention(
    g: GraphBuilder,
    q: Tensor,
    kt: Tensor,
    v: Tensor,
    *,
    q_scale: float | None = None,
    k_scale: float | None = None,
    terms: tuple[Tensor, ...] = (),
    guard: bool = False,
) -> Tensor:
    """softmax(q' @ kt' + terms...) @ v, q' = q * q_scale and kt' = kt * k_scale (sdpa's form)."""
    s = g.matmul(
        q if q_scale is None else g.mul(q, q_scale), kt if k_scale is None else g.mul(kt, k_scale)
    )
    for t in terms:
        s = g.add(s, t)
    p = g.softmax(s)
    if guard:
        p = g.where(g.op("IsNaN", p), 0.0, p)
    return g.matmul(p, v)


def _k_transposed(g: GraphBuilder, k: Tensor) -> Tensor:
    return g.transpose(k, (0, 1, 3, 2))


def _one_attention(after: Graph) -> Node:
    (node,) = [n for n in after.nodes if n.op == "Attention"]
    return node


def test_scale_split_over_q_and_k_is_one_scale() -> None:
    """torch's sdpa decomposition scales q and k^T by sqrt(scale) each."""

    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        return _attention(g, q, _k_transposed(g, k), v, q_scale=0.5, k_scale=0.5)

    graph = _graph(net)
    result = fuse(graph)
    after = result.fused.graph
    assert after.op_counts() == {"Attention": 1}
    node = _one_attention(after)
    assert node.inputs == ("q", "k", "v") and node.attrs["scale"] == 0.25
    assert (
        f"GraphFusionPass[{PASS}]: pattern=FlashAttention, matched_times=1, effected_times=1"
        in (result.report.log_lines())
    )
    assert_same_outputs(graph, after)


def test_scale_as_divisions_of_q_and_of_the_scores() -> None:
    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        s = g.div(g.matmul(g.div(q, 2.0), _k_transposed(g, k)), 4.0)
        return g.matmul(g.softmax(s), v)

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert _one_attention(after).attrs["scale"] == 0.125
    assert_same_outputs(graph, after)


@pytest.mark.parametrize("constant_bias", [True, False])
def test_two_additive_terms_become_one_mask_operand(constant_bias: bool) -> None:
    """T5: scores + position bias (1, H, S, S) + padding mask (B, 1, 1, S)."""
    bias_values = np.random.default_rng(4).standard_normal((1, H, S, S))

    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        bias = g.const(bias_values) if constant_bias else g.input("bias", (1, H, S, S))
        return _attention(g, q, _k_transposed(g, k), v, terms=(bias, g.input("mask", (B, 1, 1, S))))

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert after.op_counts() == {"Attention": 1, "Add": 1}
    node = _one_attention(after)
    (add,) = [n for n in after.nodes if n.op == "Add"]
    assert node.inputs[3] == add.outputs[0] and "mask" in add.inputs
    assert after.values[add.outputs[0]].shape == (B, H, S, S)
    assert_same_outputs(graph, after)


def test_two_constant_terms_become_one_constant_mask() -> None:
    rng = np.random.default_rng(5)
    bias, mask = rng.standard_normal((1, H, S, S)), np.where(np.tri(S) > 0, 0.0, -1e9)

    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        return _attention(g, q, _k_transposed(g, k), v, terms=(g.const(bias), g.const(mask)))

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert after.op_counts() == {"Attention": 1}
    np.testing.assert_array_equal(after.constants[_one_attention(after).inputs[3]], bias + mask)
    assert_same_outputs(graph, after)


def test_a_causal_mask_built_from_a_comparison_is_the_mask_operand() -> None:
    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        rows, cols = g.const(np.arange(S).reshape(S, 1)), g.input("cols", (1, S))
        mask = g.where(g.less(rows, cols), -1e9, 0.0)
        return _attention(g, q, _k_transposed(g, k), v, q_scale=0.5, terms=(mask,))

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert after.op_counts()["Attention"] == 1 and "Softmax" not in after.op_counts()
    where = next(n for n in after.nodes if n.op == "Where")
    assert _one_attention(after).inputs[3] == where.outputs[0]
    assert_same_outputs(graph, after)


def _fully_masked_rows() -> np.ndarray:
    """A (B, 1, S, S) mask with -inf everywhere in some rows (sdpa's NaN rows)."""
    mask = np.zeros((B, 1, S, S))
    mask[0, 0, 1, :] = -np.inf
    mask[1, 0, 3, :] = -np.inf
    mask[1, 0, 0, 2:] = -np.inf
    return mask


def test_sdpa_nan_guard_moves_after_the_kernel() -> None:
    """Where(IsNaN(p), 0, p) @ v: the kernel's NaN rows are zeroed after it, as sdpa's guard."""

    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        mask = g.const(_fully_masked_rows())
        return _attention(
            g, q, _k_transposed(g, k), v, q_scale=0.5, k_scale=0.5, terms=(mask,), guard=True
        )

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert after.op_counts() == {"Attention": 1, "IsNaN": 1, "Where": 1}
    assert [n.op for n in after.nodes][-1] == "Where" and after.outputs == graph.outputs
    inputs = random_inputs(graph, seed=1)
    want, got = run_graph(graph, inputs), run_graph(after, inputs)
    (name,) = graph.outputs
    assert np.all(want[name][0, :, 1] == 0.0) and np.all(np.isfinite(want[name]))
    np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12)


def test_dynamo_k_transpose_is_k_itself() -> None:
    """torch.onnx dynamo writes k.transpose(-2, -1) as flatten, Transpose(0, 2, 1), unflatten."""

    def net(g: GraphBuilder) -> Tensor:
        q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, H, S, D)), g.input("v", (B, H, S, D))
        kt = g.reshape(g.transpose(g.reshape(k, (B * H, S, D)), (0, 2, 1)), (B, H, D, S))
        return _attention(g, q, kt, v, q_scale=0.5, k_scale=0.5)

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert after.op_counts() == {"Attention": 1}
    assert _one_attention(after).inputs == ("q", "k", "v")
    assert_same_outputs(graph, after)


# ---- grouped-query attention -------------------------------------------------------------------
def _repeat_kv(g: GraphBuilder, t: Tensor, form: str) -> Tensor:
    """(B, KVH, S, D) -> (B, H, S, D) as the exporters write repeat_kv (or a Tile / Concat)."""
    if form == "expand":  # transformers' repeat_kv: unsqueeze, expand, reshape
        return g.reshape(g.expand(g.reshape(t, (B, KVH, 1, S, D)), (B, KVH, G, S, D)), (B, H, S, D))
    if form == "tile":
        return g.op("Tile", t, repeats=(1, G, 1, 1))
    assert form == "concat"
    return g.concat([t] * G, axis=1)


def _gqa(form: str, mask_shape: tuple[int, ...] | None = (B, 1, S, S), leak: bool = False) -> Graph:
    def net(g: GraphBuilder) -> Tensor | tuple[Tensor, ...]:
        q = g.input("q", (B, H, S, D))
        k, v = g.input("k", (B, KVH, S, D)), g.input("v", (B, KVH, S, D))
        if form == "dynamo":  # after canonicalization: the merging Reshape flattens the heads
            k5 = g.expand(g.reshape(k, (B, KVH, 1, S, D)), (B, KVH, G, S, D))
            kt = g.reshape(g.transpose(g.reshape(k5, (B * H, S, D)), (0, 2, 1)), (B, H, D, S))
            v_rep = _repeat_kv(g, v, "expand")
        else:
            k_rep = _repeat_kv(g, k, form)
            kt, v_rep = _k_transposed(g, k_rep), _repeat_kv(g, v, form)
        terms = () if mask_shape is None else (g.input("mask", mask_shape),)
        out = _attention(g, q, kt, v_rep, q_scale=0.5, k_scale=0.5, terms=terms)
        return (out, v_rep) if leak else out

    return _graph(net)


@pytest.mark.parametrize("form", ["expand", "dynamo", "tile", "concat"])
@pytest.mark.parametrize("mask_shape", [(B, 1, S, S), (B, H, S, S), (S, S), None], ids=str)
def test_grouped_query_attention_reads_k_and_v_unrepeated(
    form: str, mask_shape: tuple[int, ...] | None
) -> None:
    graph = _gqa(form, mask_shape)
    result = fuse(graph)
    after = result.fused.graph
    ops = after.op_counts()
    assert ops["Attention"] == 1 and not {"Expand", "Tile", "Concat", "Transpose"} & set(ops)
    line = f"GraphFusionPass[{PASS}]: pattern=FlashAttentionGqa, matched_times=1, effected_times=1"
    assert line in result.report.log_lines()
    node = _one_attention(after)
    shapes = [after.values[i].shape for i in node.inputs]
    grouped = (B, KVH, G) if form in ("expand", "dynamo") else (B, G, KVH)
    kv = tuple(1 if d == G else d for d in grouped)
    assert shapes[0] == (*grouped, S, D) and shapes[1] == shapes[2] == (*kv, S, D)
    assert all(after.values[i].size == B * KVH * S * D for i in node.inputs[1:3])  # no copies
    assert after.values[graph.outputs[0]].shape == (B, H, S, D)
    assert_same_outputs(graph, after)


def test_multi_query_attention_broadcasts_the_one_kv_head() -> None:
    def net(g: GraphBuilder) -> Tensor:
        q = g.input("q", (B, H, S, D))
        k, v = g.input("k", (B, 1, S, D)), g.input("v", (B, 1, S, D))
        k_rep, v_rep = g.expand(k, (B, H, S, D)), g.expand(v, (B, H, S, D))
        return _attention(
            g,
            q,
            _k_transposed(g, k_rep),
            v_rep,
            q_scale=0.5,
            terms=(g.input("mask", (B, 1, S, S)),),
        )

    graph = _graph(net)
    after = fuse(graph).fused.graph
    assert "Expand" not in after.op_counts()
    assert after.op_counts() == {"Attention": 1}  # k, v broadcast over the heads as they are
    node = _one_attention(after)
    assert node.inputs[1:3] == ("k", "v")
    assert_same_outputs(graph, after)


def test_repeated_kv_read_elsewhere_stay_repeated() -> None:
    """The repeated v is also a graph output: it must be made, so the plain pattern applies."""
    graph = _gqa("expand", leak=True)
    result = fuse(graph)
    after = result.fused.graph
    assert result.report.effected(PASS) == 1
    patterns = {a.pattern for a in result.report.applications if a.pass_name == PASS}
    assert patterns == {"FlashAttentionGqa"}  # k is still read un-repeated
    assert after.op_counts()["Expand"] == 1  # v's repetition, for the output
    assert_same_outputs(graph, after)


def test_grouped_query_attention_denied_keeps_the_repetition() -> None:
    graph = _gqa("expand")
    result = fuse(graph, deny={PASS: frozenset({0})})
    assert result.report.matched(PASS) == 1 and result.report.effected(PASS) == 0
    assert result.fused.graph.op_counts()["Expand"] == 2


@pytest.mark.parametrize("form", ["expand", "tile"])
def test_grouped_query_attention_kernel_matches_the_interpreter(form: str) -> None:
    """The compiled Attention kernel broadcasts the kv heads over the group (float32, kernels)."""

    def net(g: GraphBuilder) -> Tensor:
        q = g.input("q", (B, H, 16, 8))
        k, v = g.input("k", (B, KVH, 16, 8)), g.input("v", (B, KVH, 16, 8))

        def rep(t: Tensor) -> Tensor:
            if form == "tile":
                return g.op("Tile", t, repeats=(1, G, 1, 1))
            return g.reshape(
                g.expand(g.reshape(t, (B, KVH, 1, 16, 8)), (B, KVH, G, 16, 8)), (B, H, 16, 8)
            )

        mask = g.const(np.where(np.tri(16) > 0, 0.0, -np.inf).astype(np.float32))
        return _attention(
            g, q, _k_transposed(g, rep(k)), rep(v), q_scale=0.5, k_scale=0.7, terms=(mask,)
        )

    g = GraphBuilder("gqa32")
    g.output(net(g))
    graph = g.build()
    fused = run_pipeline(graph, FusionConfig.defaults()).fused
    assert "FlashAttentionGqa" in {
        a.pattern for a in run_pipeline(graph, FusionConfig.defaults()).report.applications
    }
    inputs = random_inputs(graph, seed=2)
    got = build_program(fused).run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
