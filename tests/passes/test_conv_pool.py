"""ConvMaxPoolFusionPass: a MaxPool after a Conv's epilogue runs in the conv's kernel. Checked
against the float64 interpreter and, bit for bit, against the same conv kernel (the packed
``lanes`` layout) followed by the pool kernel; NaN propagation; where it must not apply; with
ConvConcatFusionPass writing the pooled channels into a Concat; and MaxPoolConcatSwapPass
moving a SqueezeNet fire's pool onto its two convs."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir import Graph, GraphBuilder, Tensor, run_graph
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.runtime import build_program

F32 = np.float32
PASS = "ConvMaxPoolFusionPass"
LANES = {"ConvOutputSplitFusionPass.algo": 4, "ConvOutputSplitFusionPass.orient": 2}  # the fused kernel's


def _conv(g: GraphBuilder, x: Tensor, c: int, m: int, k: int, seed: int, stride: int = 1, group: int = 1,
          act: str = "Relu") -> Tensor:
    rng = np.random.default_rng(seed)
    w = g.const((rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(F32))
    b = g.const(rng.standard_normal(m).astype(F32))
    p = k // 2 if stride == 1 else 0
    return g.op(act, g.op("Conv", x, w, b, strides=(stride, stride), pads=(p,) * 4, group=group))


def conv_pool(batch: int = 2, c: int = 3, hw: int = 31, m: int = 16, k: int = 3, stride: int = 1, group: int = 1,
              pool: tuple[int, int, int] = (3, 2, 1), act: str = "Relu") -> Graph:
    """Conv + bias + ``act`` + MaxPool (kernel, stride, ceil_mode), as SqueezeNet's stem."""
    g = GraphBuilder("conv_pool", dtype="float32")
    x = g.input("x", (batch, c, hw, hw))
    y = _conv(g, x, c, m, k, 1, stride, group, act)
    pk, ps, ceil = pool
    g.output(g.op("MaxPool", y, kernel_shape=(pk, pk), strides=(ps, ps), ceil_mode=ceil))
    return g.build()


def _pipeline(graph: Graph, on: bool, split: dict[str, int] | None = None) -> PipelineResult:
    config = FusionConfig.defaults().with_switches(**{PASS: on})
    return run_pipeline(graph, config.with_splits(**split) if split else config)


def _inputs(graph: Graph, nan: bool = False) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal(graph.values["x"].shape).astype(F32)
    if nan:
        x[0, 0, 5, 7] = np.nan
    return {"x": x}


def _applied(result: PipelineResult, name: str = PASS) -> int:
    return sum(s.effected_times for s in result.report.stats if s.pass_name == name)


CASES = {
    "stem 3x3 s2 3->16 @64, pool 3x3 s2 ceil": dict(c=3, hw=64, m=16, k=3, stride=2),
    "3x3 8->24 @15, pool 3x3 s2 ceil": dict(c=8, hw=15, m=24),
    "1x1 16->12 @8, pool 2x2 s2": dict(c=16, hw=8, m=12, k=1, pool=(2, 2, 0)),
    "depthwise 3x3 8 @9, pool 3x3 s1": dict(c=8, hw=9, m=8, group=8, pool=(3, 1, 0)),
    "batch 3, Sigmoid, pool 2x2 s2 floor": dict(batch=3, c=4, hw=11, m=8, pool=(2, 2, 0), act="Sigmoid"),
}


@pytest.mark.parametrize("case", CASES)
def test_the_fused_pool_is_the_pool_of_the_same_conv(case: str) -> None:
    graph = conv_pool(**CASES[case])
    on, off = _pipeline(graph, True, LANES), _pipeline(graph, False, LANES)
    assert _applied(on) == 1
    p_on, p_off = build_program(on.fused), build_program(off.fused)
    assert (p_on.kernel_count, p_off.kernel_count) == (1, 2)
    for nan in (False, True):
        inputs = _inputs(graph, nan)
        got = p_on.run(inputs)[graph.outputs[0]]
        np.testing.assert_array_equal(got, p_off.run(inputs)[graph.outputs[0]])
        if nan:
            assert np.isnan(got).any()
        else:
            want = run_graph(graph, inputs)[graph.outputs[0]]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_not_when_the_pool_reads_padding_or_the_conv_output_is_read_elsewhere() -> None:
    g = GraphBuilder("padded", dtype="float32")
    x = g.input("x", (2, 4, 8, 8))
    g.output(g.op("MaxPool", _conv(g, x, 4, 8, 3, 1), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)))
    assert _applied(_pipeline(g.build(), True)) == 0

    g = GraphBuilder("shared", dtype="float32")
    x = g.input("x", (2, 4, 8, 8))
    y = _conv(g, x, 4, 8, 3, 1)
    g.output(g.op("MaxPool", y, kernel_shape=(2, 2), strides=(2, 2)))
    g.output(g.op("Sigmoid", y))
    assert _applied(_pipeline(g.build(), True)) == 0

    g = GraphBuilder("average", dtype="float32")
    x = g.input("x", (2, 4, 8, 8))
    g.output(g.op("AveragePool", _conv(g, x, 4, 8, 3, 1), kernel_shape=(2, 2), strides=(2, 2)))
    assert _applied(_pipeline(g.build(), True)) == 0


def test_not_with_fewer_images_and_groups_than_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused task holds a whole plane: one image of a dense conv would run on one thread."""
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    assert _applied(_pipeline(conv_pool(batch=1, c=4, hw=9, m=8), True)) == 0
    assert _applied(_pipeline(conv_pool(batch=2, c=4, hw=9, m=8), True)) == 1


def test_pooled_convs_write_into_their_concat() -> None:
    """Two Conv + Relu + MaxPool branches joined on the channels: both pools fused, and the
    pooled channels written into the Concat's output (ConvConcatFusionPass)."""
    g = GraphBuilder("branches", dtype="float32")
    x = g.input("x", (2, 4, 15, 15))
    parts = [g.op("MaxPool", _conv(g, x, 4, m, k, s), kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)
             for m, k, s in ((8, 1, 2), (12, 3, 3))]
    g.output(_conv(g, g.concat(parts, axis=1), 20, 6, 1, 4))
    graph = g.build()
    on, off = _pipeline(graph, True, LANES), _pipeline(graph, False, LANES)
    assert _applied(on) == 2 and _applied(on, "ConvConcatFusionPass") == 1
    assert _applied(off, "ConvConcatFusionPass") == 0  # its parts are pools, no convs
    inputs = _inputs(graph)
    got = build_program(on.fused).run(inputs)[graph.outputs[0]]
    np.testing.assert_array_equal(got, build_program(off.fused).run(inputs)[graph.outputs[0]])


def fire_pool(batch: int = 2) -> Graph:
    """A SqueezeNet fire module whose Concat a MaxPool reads, then the next squeeze conv."""
    g = GraphBuilder("fire_pool", dtype="float32")
    x = g.input("x", (batch, 8, 15, 15))
    sq = _conv(g, x, 8, 4, 1, 1)
    cat = g.concat([_conv(g, sq, 4, 8, 1, 2), _conv(g, sq, 4, 12, 3, 3)], axis=1)
    g.output(_conv(g, g.op("MaxPool", cat, kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), 20, 6, 1, 4))
    return g.build()


def test_a_fire_modules_pool_moves_onto_its_convs() -> None:
    graph = fire_pool()
    passes = ("MaxPoolConcatSwapPass", PASS, "ConvConcatFusionPass")
    on = run_pipeline(graph, FusionConfig.defaults().with_splits(**LANES))
    off = run_pipeline(graph, FusionConfig.defaults().with_switches(**dict.fromkeys(passes, False)).with_splits(**LANES))
    assert [_applied(on, p) for p in passes] == [1, 2, 1]
    p_on, p_off = build_program(on.fused), build_program(off.fused)
    assert (p_on.kernel_count, p_off.kernel_count) == (4, 6)  # squeeze, two expands (+ pools), next
    inputs = _inputs(graph)
    got = p_on.run(inputs)[graph.outputs[0]]
    np.testing.assert_array_equal(got, p_off.run(inputs)[graph.outputs[0]])
    want = run_graph(graph, inputs)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_the_swap_needs_convs_and_a_pool_that_alone_reads_the_concat() -> None:
    g = GraphBuilder("inputs", dtype="float32")
    a, b = g.input("a", (2, 4, 7, 7)), g.input("b", (2, 4, 7, 7))
    g.output(g.op("MaxPool", g.concat([a, b], axis=1), kernel_shape=(2, 2), strides=(2, 2)))
    assert _applied(_pipeline(g.build(), True), "MaxPoolConcatSwapPass") == 0

    g = GraphBuilder("read_twice", dtype="float32")
    x = g.input("x", (2, 4, 7, 7))
    cat = g.concat([_conv(g, x, 4, 4, 3, 1), _conv(g, x, 4, 4, 1, 2)], axis=1)
    g.output(g.op("MaxPool", cat, kernel_shape=(2, 2), strides=(2, 2)))
    g.output(g.op("Sigmoid", cat))
    assert _applied(_pipeline(g.build(), True), "MaxPoolConcatSwapPass") == 0
