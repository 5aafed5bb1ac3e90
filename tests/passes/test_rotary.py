"""RotaryPositionEmbeddingFusionPass and its kernel, on the spellings transformers exports."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.runtime import build_program

PASS = "RotaryPositionEmbeddingFusionPass"
B, H, S, D = 2, 4, 6, 8


def _fuse(graph: Graph, *, all_on: bool = False) -> PipelineResult:
    if all_on:
        return run_pipeline(graph, FusionConfig.defaults())
    config = FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False}, explicit={PASS: True})
    return run_pipeline(graph, config)


def _rotate_half(g: GraphBuilder, x: Tensor, how: str) -> Tensor:
    if how == "split":
        x1, x2 = g.split(x, (D // 2, D // 2), axis=-1)
    else:
        # The dynamo exporter writes the end of the second slice as INT64_MAX; the importer
        # clamps it, and the builder's Slice takes the clamped form.
        x1 = g.slice(x, (0,), (D // 2,), (-1,))
        x2 = g.slice(x, (D // 2,), (D,), (3,))
    neg = g.mul(x2, -1.0) if how == "mul_minus_one" else g.neg(x2)
    return g.concat([neg, x1], axis=-1)


def _rope(g: GraphBuilder, x: Tensor, cos: Tensor, sin: Tensor, how: str = "slices", swap: bool = False) -> Tensor:
    a = g.mul(cos, x) if swap else g.mul(x, cos)
    b = g.mul(sin, _rotate_half(g, x, how)) if swap else g.mul(_rotate_half(g, x, how), sin)
    return g.add(b, a) if swap else g.add(a, b)


def _cos_sin(g: GraphBuilder, as_inputs: bool) -> tuple[Tensor, Tensor]:
    if as_inputs:
        return g.input("cos", (B, 1, S, D)), g.input("sin", (B, 1, S, D))
    inv = 1.0 / 10000 ** (np.arange(0, D, 2) / D)
    freqs = np.outer(np.arange(S), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)[None, None]
    return g.const(np.cos(emb)), g.const(np.sin(emb))


def _graph(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], dtype: str = "float64") -> Graph:
    g = GraphBuilder("rope", dtype=dtype)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def _assert_same(before: Graph, after: Graph, rtol: float = 1e-12) -> None:
    inputs = random_inputs(before, seed=3)
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("how", ["slices", "split", "mul_minus_one"])
@pytest.mark.parametrize("swap", [False, True], ids=["x_first", "commuted"])
@pytest.mark.parametrize("as_inputs", [False, True], ids=["const_cos", "input_cos"])
def test_rotary_fuses_every_spelling(how: str, swap: bool, as_inputs: bool) -> None:
    def net(g: GraphBuilder) -> Tensor:
        cos, sin = _cos_sin(g, as_inputs)
        return _rope(g, g.input("q", (B, H, S, D)), cos, sin, how, swap)

    graph = _graph(net)
    result = _fuse(graph)
    after = result.fused.graph
    assert [n.op for n in after.nodes] == ["RotaryPositionEmbedding"]
    line = f"GraphFusionPass[{PASS}]: pattern=RotaryPositionEmbedding, matched_times=1, effected_times=1"
    assert line in result.report.log_lines()
    _assert_same(graph, after)


def test_rotary_fuses_q_and_k_sharing_cos_and_sin() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        cos, sin = _cos_sin(g, False)
        return _rope(g, g.input("q", (B, H, S, D)), cos, sin), _rope(g, g.input("k", (B, 2, S, D)), cos, sin)

    graph = _graph(net)
    result = _fuse(graph)
    assert result.fused.graph.op_counts() == {"RotaryPositionEmbedding": 2}
    apps = [a for a in result.report.applications if a.pass_name == PASS]
    assert [a.index for a in apps] == [0, 1]
    # application 0 is q's (first in graph order): bisection names it by the original nodes
    assert any(n.startswith("Mul") for n in apps[0].nodes)
    _assert_same(graph, result.fused.graph)


def test_rotary_leaves_a_rotation_that_is_not_rotate_half_alone() -> None:
    def wrong_order(g: GraphBuilder) -> Tensor:
        x = g.input("q", (B, H, S, D))
        x1 = g.slice(x, (0,), (D // 2,), (-1,))
        x2 = g.slice(x, (D // 2,), (D,), (-1,))
        rot = g.concat([g.neg(x1), x2], axis=-1)  # the halves are not swapped
        return g.add(g.mul(x, g.input("cos", (D,))), g.mul(rot, g.input("sin", (D,))))

    assert _fuse(_graph(wrong_order)).report.matched(PASS) == 0


def test_rotary_leaves_a_narrower_cos_alone() -> None:
    def half_width(g: GraphBuilder) -> Tensor:
        x = g.input("q", (B, H, S, D))
        cos = g.input("cos", (B, 1, S, 1))  # broadcasts, but is not a per-frequency table
        return g.add(g.mul(x, cos), g.mul(_rotate_half(g, x, "slices"), g.input("sin", (D,))))

    assert _fuse(_graph(half_width)).report.effected(PASS) == 0


def test_rotary_with_a_second_reader_of_the_rotated_copy_is_not_fused() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("q", (B, H, S, D))
        rot = _rotate_half(g, x, "slices")
        y = g.add(g.mul(x, g.input("cos", (D,))), g.mul(rot, g.input("sin", (D,))))
        return y, rot

    assert _fuse(_graph(net)).report.matched(PASS) == 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rotary_program_matches_the_unfused_interpreter(dtype: str) -> None:
    def net(g: GraphBuilder) -> Tensor:
        cos, sin = _cos_sin(g, False)
        q = g.matmul(g.input("h", (B, H, S, 16)), g.const(np.random.default_rng(0).standard_normal((16, D))))
        return _rope(g, q, cos, sin)

    graph = _graph(net, dtype)
    result = _fuse(graph, all_on=True)
    assert result.report.effected(PASS) == 1
    program = build_program(result.fused)
    inputs = random_inputs(graph, seed=1)
    got = program.run(inputs)
    want = run_graph(graph, inputs)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol)
