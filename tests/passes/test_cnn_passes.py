"""CNN passes: ConvBatchnormFusionPass, ConvBiasAddFusionPass, TbeConvElemwiseFusionPass,
ConvOutputSplitFusionPass; and a ResNet basic block end to end against the float64 interpreter."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir import Graph, GraphBuilder, Tensor, run_graph
from fusiontune.passes.graph.conv_batchnorm import fold_conv_bn
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.runtime import build_program

F32 = np.float32


def _c(g: GraphBuilder, shape: tuple[int, ...], seed: int, positive: bool = False) -> Tensor:
    rng = np.random.default_rng(seed)
    arr = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    return g.const(arr.astype(F32))


def _bn(g: GraphBuilder, y: Tensor, m: int, seed: int = 10) -> Tensor:
    return g.op(
        "BatchNorm", y, _c(g, (m, 1, 1), seed, True), _c(g, (m, 1, 1), seed + 1),
        _c(g, (m, 1, 1), seed + 2), _c(g, (m, 1, 1), seed + 3, True), eps=1e-3,
    )


def _conv(g: GraphBuilder, x: Tensor, c: int, m: int, seed: int, bias: bool = False) -> Tensor:
    w = (np.random.default_rng(seed).standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(F32)
    ins = [x, g.const(w)] + ([_c(g, (m,), seed + 1)] if bias else [])
    return g.op("Conv", *ins, pads=(1, 1, 1, 1))


def _run(graph: Graph, on: tuple[str, ...], deny: Mapping[str, frozenset[int]] | None = None,
         split: Mapping[str, int] | None = None) -> PipelineResult:
    config = FusionConfig.resolve(
        all_switch={"GraphFusion": False, "UBFusion": False}, explicit={p: True for p in on}, split_points=split
    )
    return run_pipeline(graph, config, deny=deny)


def _inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(graph.values[n].shape).astype(graph.values[n].dtype) for n in graph.inputs}


def _conv_bn_graph(bias: bool = True, const_params: bool = True) -> Graph:
    g = GraphBuilder("conv_bn")
    x = g.input("x", (2, 4, 6, 6))
    y = _conv(g, x, 4, 6, 1, bias)
    if const_params:
        y = _bn(g, y, 6)
    else:
        y = g.op("BatchNorm", y, g.input("scale", (6, 1, 1)), _c(g, (6, 1, 1), 2), _c(g, (6, 1, 1), 3), _c(g, (6, 1, 1), 4, True))
    g.output(y)
    return g.build()


# ---- ConvBatchnormFusionPass ----------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_conv_bn_fold_is_exact_to_float32_rounding(bias: bool) -> None:
    graph = _conv_bn_graph(bias)
    result = _run(graph, ("ConvBatchnormFusionPass",))
    after = result.fused.graph
    assert after.op_counts() == {"Conv": 1}
    assert len(after.nodes[0].inputs) == 3
    assert "GraphFusionPass[ConvBatchnormFusionPass]: pattern=ConvBatchnorm, matched_times=1, effected_times=1" in result.report.log_lines()
    inputs = _inputs(graph)
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    unfused32 = run_graph(graph, inputs, dtype=None)[graph.outputs[0]]
    folded32 = run_graph(after, inputs, dtype=None)[after.outputs[0]]
    floor = np.abs(unfused32 - want).max()  # the float32 unfused error nobody can beat
    assert np.abs(folded32 - want).max() <= 4 * floor + 1e-6
    np.testing.assert_allclose(folded32, unfused32, rtol=1e-5, atol=2e-6)


def test_fold_conv_bn_identity_in_float64() -> None:
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 2, 1, 1)), rng.standard_normal(3)
    s, beta, mean, var = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3), rng.standard_normal(3), rng.uniform(0.5, 1.5, 3)
    w2, b2 = fold_conv_bn(w, b, s, beta, mean, var, 1e-5)
    x = rng.standard_normal(2)
    y = w[:, :, 0, 0] @ x + b
    np.testing.assert_allclose(w2[:, :, 0, 0] @ x + b2, (y - mean) / np.sqrt(var + 1e-5) * s + beta, rtol=1e-12)


def test_conv_bn_fold_needs_constant_params() -> None:
    graph = _conv_bn_graph(const_params=False)
    result = _run(graph, ("ConvBatchnormFusionPass",))
    assert result.report.matched("ConvBatchnormFusionPass") == 0
    assert result.fused.graph.structural_hash() == graph.structural_hash()


def test_conv_bn_fold_needs_a_constant_weight() -> None:
    g = GraphBuilder("w_input")
    g.output(_bn(g, g.op("Conv", g.input("x", (1, 2, 4, 4)), g.input("w", (3, 2, 3, 3))), 3))
    graph = g.build()
    assert _run(graph, ("ConvBatchnormFusionPass",)).report.matched("ConvBatchnormFusionPass") == 0


def test_conv_bn_fold_denied_through_the_context() -> None:
    graph = _conv_bn_graph()
    result = _run(graph, ("ConvBatchnormFusionPass",), deny={"ConvBatchnormFusionPass": frozenset({0})})
    assert result.report.matched("ConvBatchnormFusionPass") == 1
    assert result.report.effected("ConvBatchnormFusionPass") == 0
    assert result.fused.graph.structural_hash() == graph.structural_hash()


def test_conv_bn_passes_leave_an_already_folded_conv_alone() -> None:
    """Exporters fold BatchNorm into the conv in eval mode: a Conv with its bias, then Relu."""
    g = GraphBuilder("folded")
    g.output(g.relu(_conv(g, g.input("x", (2, 4, 6, 6)), 4, 6, 1, bias=True)))
    graph = g.build()
    result = _run(graph, ("ConvBatchnormFusionPass", "ConvBiasAddFusionPass"))
    assert result.report.matched("ConvBatchnormFusionPass") == 0
    assert result.report.matched("ConvBiasAddFusionPass") == 0
    assert result.fused.graph.structural_hash() == graph.structural_hash()
    inputs, (out,) = _inputs(graph), graph.outputs
    np.testing.assert_array_equal(run_graph(result.fused.graph, inputs)[out], run_graph(graph, inputs)[out])


# ---- ConvBiasAddFusionPass ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 1, 1), (1, 6, 1, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_bias_add_folds_a_per_channel_constant(shape: tuple[int, ...], bias: bool) -> None:
    g = GraphBuilder("conv_add")
    g.output(g.add(_c(g, shape, 5), _conv(g, g.input("x", (1, 4, 5, 5)), 4, 6, 1, bias)))
    graph = g.build()
    result = _run(graph, ("ConvBiasAddFusionPass",))
    after = result.fused.graph
    assert after.op_counts() == {"Conv": 1}
    inputs = _inputs(graph)
    # b + c is rounded to float32 once: exact up to that rounding.
    np.testing.assert_allclose(
        run_graph(after, inputs)[after.outputs[0]], run_graph(graph, inputs)[graph.outputs[0]], rtol=1e-6, atol=1e-6
    )


def test_conv_bias_add_leaves_a_spatial_add_alone() -> None:
    g = GraphBuilder("conv_add_spatial")
    g.output(g.add(_conv(g, g.input("x", (1, 4, 5, 5)), 4, 6, 1), _c(g, (1, 1, 5, 5), 5)))
    graph = g.build()
    assert _run(graph, ("ConvBiasAddFusionPass",)).report.matched("ConvBiasAddFusionPass") == 0


# ---- TbeConvElemwiseFusionPass --------------------------------------------------------------------
def _resnet_block() -> Graph:
    """ResNet basic block: conv-BN-relu, conv-BN, + identity, relu (two blocks, so the second
    block's residual reads the first block's output kernel)."""
    g = GraphBuilder("resnet_block")
    x = g.input("x", (2, 8, 10, 10))
    for blk in range(2):
        h = g.relu(_bn(g, _conv(g, x, 8, 8, 20 * blk + 1), 8, 20 * blk + 2))
        h = _bn(g, _conv(g, h, 8, 8, 20 * blk + 3), 8, 20 * blk + 4)
        x = g.relu(g.add(h, x))
    g.output(x)
    return g.build()


def test_conv_epilogue_groups_form_and_kernel_count_drops() -> None:
    graph = _resnet_block()
    off = _run(graph, ())
    on = _run(graph, ("TbeConvElemwiseFusionPass",))
    assert off.fused.kernel_count == 14
    # Each conv absorbs its BN (unfolded), and the Relu / residual Add + Relu after it.
    assert on.fused.kernel_count == 4
    for grp in on.fused.groups:
        assert "TbeConvElemwiseFusionPass" in grp.passes
    assert on.report.effected("TbeConvElemwiseFusionPass") == 4
    inputs = _inputs(graph)
    got = build_program(on.fused).run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv_epilogue_denied_application_keeps_its_kernels_apart() -> None:
    graph = _resnet_block()
    result = _run(graph, ("TbeConvElemwiseFusionPass",), deny={"TbeConvElemwiseFusionPass": frozenset({1})})
    assert result.report.matched("TbeConvElemwiseFusionPass") == 4
    assert result.report.effected("TbeConvElemwiseFusionPass") == 3
    denied = [a for a in result.report.applications if not a.applied]
    assert len(denied) == 1 and any(n.startswith("Conv") for n in denied[0].nodes)
    assert result.fused.kernel_count == 4 + 3  # the denied conv, BN, Add, Relu stay apart


def test_other_ub_passes_leave_conv_groups_to_the_conv_pass() -> None:
    """With the conv epilogue pass off, basic and composite fusion do not merge into a Conv."""
    graph = _resnet_block()
    result = _run(graph, ("TbeEltwiseFusionPass", "CompositeOpsFusionPass", "MatmulElemReluFusionPass"))
    for grp in result.fused.groups:
        ops = [result.fused.graph.node(n).op for n in grp.nodes]
        assert "Conv" not in ops or ops == ["Conv"]


# ---- TbeElemwiseConvFusionPass --------------------------------------------------------------------
def _prologue_block() -> Graph:
    """DenseNet's pre-activation (BatchNorm + Relu before a 1x1 and a 3x3 conv) and a
    squeeze-and-excite gate's per-image, per-channel scale before a 1x1 projection
    (EfficientNet's), with the unit before each conv read by that conv alone."""
    g = GraphBuilder("prologue_block")
    x = g.input("x", (2, 8, 10, 10))
    w1 = (np.random.default_rng(50).standard_normal((12, 8, 1, 1)) / np.sqrt(8)).astype(F32)
    h = g.op("Conv", g.relu(_bn(g, x, 8, 30)), g.const(w1))
    h = _conv(g, g.relu(_bn(g, h, 12, 40)), 12, 8, 41, bias=True)
    gate = g.sigmoid(g.input("s", (2, 8, 1, 1)))
    w2 = (np.random.default_rng(51).standard_normal((6, 8, 1, 1)) / np.sqrt(8)).astype(F32)
    g.output(g.relu(g.op("Conv", g.mul(h, gate), g.const(w2))))
    return g.build()


def test_conv_prologue_groups_form_and_match_the_interpreter() -> None:
    graph = _prologue_block()
    basic = _run(graph, ("TbeEltwiseFusionPass",))
    on = _run(graph, ("TbeEltwiseFusionPass", "TbeElemwiseConvFusionPass"))
    assert on.report.effected("TbeElemwiseConvFusionPass") == 3
    # BatchNorm, Relu, Sigmoid and Mul are kernels of their own before (10 in all); after, the
    # three convs and the last Relu (the epilogue pass is off)
    assert (basic.fused.kernel_count, on.fused.kernel_count) == (10, 4)
    convs = [grp for grp in on.fused.groups if any(on.fused.graph.node(n).op == "Conv" for n in grp.nodes)]
    assert len(convs) == 3 and all("TbeElemwiseConvFusionPass" in grp.passes for grp in convs)
    ops = [[on.fused.graph.node(n).op for n in grp.nodes] for grp in convs]
    assert ops[0] == ["BatchNorm", "Relu", "Conv"] and ops[1] == ["BatchNorm", "Relu", "Conv"]
    assert "Mul" in ops[2] and "Sigmoid" in ops[2]  # the gate, computed once per image and channel
    inputs = _inputs(graph)
    got = build_program(on.fused).run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv_prologue_denied_application_keeps_its_kernel() -> None:
    graph = _prologue_block()
    result = _run(graph, ("TbeEltwiseFusionPass", "TbeElemwiseConvFusionPass"),
                  deny={"TbeElemwiseConvFusionPass": frozenset({2})})
    assert result.report.matched("TbeElemwiseConvFusionPass") == 3
    assert result.report.effected("TbeElemwiseConvFusionPass") == 2
    (denied,) = [a for a in result.report.applications if not a.applied]
    assert any(n.startswith("Mul") for n in denied.nodes)  # the gate's scale, before the projection


def test_conv_prologue_leaves_a_producer_read_elsewhere() -> None:
    """A BatchNorm + Relu whose result another kernel also reads is stored once, not recomputed."""
    g = GraphBuilder("shared")
    x = g.input("x", (1, 4, 6, 6))
    r = g.relu(_bn(g, x, 4, 60))
    g.output(_conv(g, r, 4, 4, 61), g.add(r, 1.0))
    graph = g.build()
    result = _run(graph, ("TbeEltwiseFusionPass", "TbeElemwiseConvFusionPass"))
    assert result.report.effected("TbeElemwiseConvFusionPass") == 0


# ---- the whole pipeline ---------------------------------------------------------------------------
def test_resnet_block_end_to_end_with_defaults_matches_float64_interpreter() -> None:
    graph = _resnet_block()
    result = run_pipeline(graph, FusionConfig.resolve())
    assert result.report.effected("ConvBatchnormFusionPass") == 4
    assert result.fused.graph.op_counts().get("BatchNorm", 0) == 0
    prog = build_program(result.fused)
    assert prog.kernel_count == 4  # conv+relu, conv+add+relu, twice
    inputs = _inputs(graph, seed=3)
    got = prog.run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    floor = np.abs(run_graph(graph, inputs, dtype=None)[graph.outputs[0]] - want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.abs(got - want).max() <= 10 * floor + 1e-6


@pytest.mark.parametrize("rows,algo", [(1, 0), (0, 2), (0, 4)])
def test_conv_output_split_sets_the_schedule_and_stays_exact(rows: int, algo: int) -> None:
    graph = _resnet_block()
    split = {"ConvOutputSplitFusionPass.rows": rows, "ConvOutputSplitFusionPass.algo": algo}
    result = _run(graph, ("TbeConvElemwiseFusionPass", "ConvOutputSplitFusionPass"), split=split)
    assert result.report.effected("ConvOutputSplitFusionPass") == 4
    for grp in result.fused.groups:
        assert grp.schedule.get("conv_rows", 0) == rows
        assert grp.schedule.get("conv_algo") == {0: None, 2: "direct", 4: "packed"}[algo]
    inputs = _inputs(graph)
    got = build_program(result.fused).run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
