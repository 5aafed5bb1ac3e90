"""ConvConcatFusionPass: the convs of a channel Concat write into its output, and no Concat
kernel runs. Checked against the float64 interpreter and, bit for bit, against the same program
with the pass off (only the copy goes), for every conv algorithm; and where it must not apply."""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.codegen.plan import group_sources
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir import Graph, GraphBuilder, Tensor, run_graph
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.ub.conv_output_split import ALGOS
from fusiontune.runtime import build_program
from fusiontune.runtime.program import concat_in_place

F32 = np.float32
PASS = "ConvConcatFusionPass"


def _w(g: GraphBuilder, m: int, c: int, k: int, seed: int, group: int = 1) -> Tensor:
    w = np.random.default_rng(seed).standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)
    return g.const(w.astype(F32))


def _conv(g: GraphBuilder, x: Tensor, c: int, m: int, k: int, seed: int, act: str = "Relu", group: int = 1) -> Tensor:
    bias = g.const(np.random.default_rng(seed + 100).standard_normal(m).astype(F32))
    p = k // 2
    y = g.op("Conv", x, _w(g, m, c, k, seed, group), bias, pads=(p, p, p, p), group=group)
    return g.op(act, y)


def fire(batch: int = 2, act: str = "Relu", c: int = 8, s: int = 4, e: int = 8, hw: int = 7) -> Graph:
    """A SqueezeNet fire module: squeeze 1x1, then 1x1 and 3x3 expands joined along the channels,
    read by one more conv (so the Concat's output is no graph output)."""
    g = GraphBuilder("fire", dtype="float32")
    x = g.input("x", (batch, c, hw, hw))
    sq = _conv(g, x, c, s, 1, 1)
    cat = g.concat([_conv(g, sq, s, e, 1, 2, act), _conv(g, sq, s, e + 4, 3, 3, act)], axis=1)
    g.output(_conv(g, cat, 2 * e + 4, 6, 1, 4))
    return g.build()


def _pipeline(graph: Graph, on: bool, split: dict[str, int] | None = None) -> PipelineResult:
    config = FusionConfig.defaults().with_switches(**{PASS: on})
    if split:
        config = config.with_splits(**split)
    return run_pipeline(graph, config)


def _inputs(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(graph.values[n].shape).astype(F32) for n in graph.inputs}


def _applied(result: PipelineResult) -> int:
    return sum(s.effected_times for s in result.report.stats if s.pass_name == PASS)


@pytest.mark.parametrize("algo", [0, *ALGOS])
def test_every_conv_algorithm_writes_its_channels_into_the_concat(algo: int) -> None:
    graph = fire()
    split = {"ConvOutputSplitFusionPass.algo": algo}
    on, off = _pipeline(graph, True, split), _pipeline(graph, False, split)
    assert _applied(on) == 1
    assert sum(concat_in_place(g) for g in on.fused.groups) == 1
    p_on, p_off = build_program(on.fused), build_program(off.fused)
    assert p_on.kernel_count == p_off.kernel_count - 1
    inputs = _inputs(graph)
    got = p_on.run(inputs)[graph.outputs[0]]
    np.testing.assert_array_equal(got, p_off.run(inputs)[graph.outputs[0]])
    want = run_graph(graph, inputs)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("batch", [1, 3])
def test_a_transcendental_epilogue_and_other_batches(batch: int) -> None:
    """A Sigmoid epilogue (which a conv kernel otherwise finishes over its output's flat elements,
    the ``Tail``) over few positions, and batches of one and three."""
    graph = fire(batch=batch, act="Sigmoid", hw=3)
    on, off = _pipeline(graph, True), _pipeline(graph, False)
    assert _applied(on) == 1
    inputs = _inputs(graph)
    got = build_program(on.fused).run(inputs)[graph.outputs[0]]
    np.testing.assert_array_equal(got, build_program(off.fused).run(inputs)[graph.outputs[0]])


def test_the_concat_buffer_is_planned_once() -> None:
    """Both conv kernels name the Concat's output as theirs; it gets one slot, and the planned
    peak is no higher than with the copy."""
    graph = fire()
    fused = _pipeline(graph, True).fused
    cat = next(n.outputs[0] for n in graph.nodes if n.op == "Concat")
    writers = [g.name for g, src in group_sources(fused) if not concat_in_place(g)
               for a in src.args if a.value == cat and a.role == "out"]
    assert len(writers) == 2
    prog = build_program(fused)
    assert cat in prog.plan.slot_of
    assert prog.plan.peak_bytes <= build_program(_pipeline(graph, False).fused).plan.peak_bytes


def _not_applied(graph: Graph) -> None:
    result = _pipeline(graph, True)
    assert _applied(result) == 0
    inputs = _inputs(graph)
    prog = build_program(result.fused)
    for name, got in prog.run(inputs).items():
        want = run_graph(graph, inputs)[name]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_not_when_a_part_is_read_elsewhere() -> None:
    g = GraphBuilder("shared", dtype="float32")
    x = g.input("x", (2, 4, 5, 5))
    a, b = _conv(g, x, 4, 4, 1, 1), _conv(g, x, 4, 4, 3, 2)
    g.output(g.concat([a, b], axis=1))
    g.output(g.op("Sigmoid", a))  # a second reader of a part, outside its conv's kernel
    _not_applied(g.build())


def test_not_when_a_part_is_no_conv_or_a_graph_output_or_another_axis() -> None:
    g = GraphBuilder("pool_part", dtype="float32")
    x = g.input("x", (2, 4, 6, 6))
    pooled = g.op("MaxPool", x, kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    g.output(_conv(g, g.concat([_conv(g, x, 4, 4, 3, 1), pooled], axis=1), 8, 4, 1, 2))
    _not_applied(g.build())

    g = GraphBuilder("output_part", dtype="float32")
    x = g.input("x", (2, 4, 6, 6))
    a = _conv(g, x, 4, 4, 3, 1)
    g.output(a)
    g.output(g.concat([a, _conv(g, x, 4, 4, 1, 2)], axis=1))
    _not_applied(g.build())

    g = GraphBuilder("width", dtype="float32")
    x = g.input("x", (2, 4, 6, 6))
    g.output(g.concat([_conv(g, x, 4, 4, 3, 1), _conv(g, x, 4, 4, 1, 2)], axis=3))
    _not_applied(g.build())


def test_bisect_can_deny_one_application() -> None:
    graph = fire()
    config = FusionConfig.defaults()
    denied = run_pipeline(graph, config, deny={PASS: frozenset({0})})
    assert _applied(denied) == 0
    assert not any(concat_in_place(g) for g in denied.fused.groups)
