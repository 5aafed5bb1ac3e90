"""GeGluFusionPass and the GeGlu op: before/after, interpreter equality, kernels, log, deny."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from fusiontune.codegen.numerics import ERF_MAX_ABS, TANH_MAX_ABS
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph, Node
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.ir.ops import run_reference
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import BY_NAME, PASSES
from fusiontune.runtime import build_program

PASS = "GeGluFusionPass"
F64 = "float64"
U = 2.0**-24  # the unit roundoff of float32


def fuse(
    graph: Graph, *names: str, deny: Mapping[str, frozenset[int]] | None = None
) -> PipelineResult:
    config = FusionConfig.resolve(
        all_switch={"GraphFusion": False, "UBFusion": False}, explicit=dict.fromkeys(names, True)
    )
    return run_pipeline(graph, config, deny=deny)


def build(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], dtype: str = F64) -> Graph:
    g = GraphBuilder("g", dtype=dtype)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def line(pattern: str, n: int, pass_name: str = PASS) -> str:
    return f"GraphFusionPass[{pass_name}]: pattern={pattern}, matched_times={n}, effected_times={n}"


def assert_same_outputs(before: Graph, after: Graph, rtol: float = 1e-9) -> None:
    inputs = random_inputs(before, seed=0)
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12, err_msg=name)


def t5_gated_gelu(g: GraphBuilder, x: Tensor) -> Tensor:
    """T5's gated-gelu feed-forward as torch.onnx writes it: gelu_new(x @ wi_0) * (x @ wi_1)."""
    rng = np.random.default_rng(3)
    gate = g.matmul(x, g.const(rng.standard_normal((8, 16)) / 3))
    up = g.matmul(x, g.const(rng.standard_normal((8, 16)) / 3))
    inner = g.mul(g.add(gate, g.mul(g.pow(gate, 3.0), 0.044715)), float(np.sqrt(2.0 / np.pi)))
    act = g.mul(g.mul(gate, 0.5), g.add(g.tanh(inner), 1.0))
    return g.mul(act, up)


# ---- the registry row ---------------------------------------------------------------------------
def test_registry_row_runs_after_the_gelu_passes() -> None:
    names = [p.name for p in PASSES]
    info = BY_NAME[PASS]
    assert names.index(PASS) > names.index("FastGeluPass") > names.index("GeluFusionPass")
    assert info.stage == "graph" and info.default and info.exact and info.switchable
    assert info.aliases == ()  # MindSpore has no GeGLU fusion to borrow a name from


# ---- the pass -----------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("gelu_first", [True, False])
def test_geglu_fuses_gelu_times_up(approximate: str, gelu_first: bool) -> None:
    def net(g: GraphBuilder) -> Tensor:
        act = g.gelu(g.input("gate", (3, 8)), approximate=approximate)
        up = g.input("up", (3, 8))
        return g.mul(act, up) if gelu_first else g.mul(up, act)

    graph = build(net)
    result = fuse(graph, PASS)
    after = result.fused.graph
    assert after.op_counts() == {"GeGlu": 1}
    (node,) = after.nodes
    assert node.inputs == ("gate", "up") and node.outputs == graph.outputs
    assert node.attrs.get("approximate", "none") == approximate
    assert line("GeGlu", 1) in result.report.log_lines()
    assert_same_outputs(graph, after)


def test_t5_gated_gelu_becomes_one_geglu() -> None:
    graph = build(lambda g: t5_gated_gelu(g, g.input("x", (4, 8))))
    result = fuse(graph, "GeluFusionPass", PASS)
    after = result.fused.graph
    assert after.op_counts() == {"MatMul": 2, "GeGlu": 1}
    assert line("GeluTanh", 1, "GeluFusionPass") in result.report.log_lines()
    assert line("GeGlu", 1) in result.report.log_lines()
    assert_same_outputs(graph, after)


def test_fast_gelu_then_geglu_keeps_the_tanh_approximation() -> None:
    graph = build(
        lambda g: g.mul(g.gelu_decomposed(g.input("gate", (3, 8))), g.input("up", (3, 8)))
    )
    after = fuse(graph, "GeluFusionPass", "FastGeluPass", PASS).fused.graph
    (node,) = after.nodes
    assert node.op == "GeGlu" and node.attrs["approximate"] == "tanh"


def test_geglu_needs_an_exclusive_gelu() -> None:
    def escapes(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        act = g.gelu(g.input("gate", (3, 8)))
        return g.mul(act, g.input("up", (3, 8))), act

    def squared(g: GraphBuilder) -> Tensor:
        act = g.gelu(g.input("gate", (3, 8)))
        return g.mul(act, act)

    for fn in (escapes, squared):
        graph = build(fn)
        result = fuse(graph, PASS)
        assert result.report.matched(PASS) == 0
        assert "GeGlu" not in result.fused.graph.op_counts()


def test_geglu_deny_keeps_the_graph() -> None:
    graph = build(lambda g: g.mul(g.gelu(g.input("gate", (3, 8))), g.input("up", (3, 8))))
    result = fuse(graph, PASS, deny={PASS: frozenset({0})})
    assert result.report.matched(PASS) == 1 and result.report.effected(PASS) == 0
    assert result.fused.graph.op_counts() == {"Gelu": 1, "Mul": 1}


# ---- the op -------------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_reference_is_gelu_times_up(approximate: str) -> None:
    rng = np.random.default_rng(0)
    gate, up = rng.standard_normal((4, 6)), rng.standard_normal((1, 6))
    attrs = {"approximate": approximate}
    (want,) = run_reference(Node("gelu", "Gelu", ("g",), ("y",), attrs), [gate])
    (got,) = run_reference(Node("geglu", "GeGlu", ("g", "u"), ("y",), attrs), [gate, up])
    np.testing.assert_array_equal(got, want * up)


def _one_kernel(
    graph: Graph, schedule: Mapping[str, str], inputs: Mapping[str, np.ndarray]
) -> np.ndarray:
    group = Group("all", tuple(n.name for n in graph.nodes), schedule=dict(schedule))
    prog = build_program(FusedGraph.singletons(graph).with_groups([group]))
    assert prog.kernel_count == 1
    return np.array(prog.run(inputs)[graph.outputs[0]], copy=True)


@pytest.mark.parametrize(
    ("approximate", "f_max_abs"), [("none", ERF_MAX_ABS), ("tanh", TANH_MAX_ABS)]
)
@pytest.mark.parametrize("math", ["libm", "approx"])
def test_geglu_kernel_matches_float64(approximate: str, f_max_abs: float, math: str) -> None:
    """|kernel - float64| <= 0.5 |x| (erf/tanh error + float32 roundings) |up| + a rounding."""
    graph = build(
        lambda g: g.op(
            "GeGlu", g.input("gate", (24, 65)), g.input("up", (24, 65)), approximate=approximate
        ),
        dtype="float32",
    )
    rng = np.random.default_rng(1)
    inputs = {n: (rng.standard_normal((24, 65)) * 3).astype(np.float32) for n in ("gate", "up")}
    got = _one_kernel(graph, {} if math == "libm" else {"math": "approx"}, inputs).astype(
        np.float64
    )
    want = run_graph(graph, inputs)[graph.outputs[0]]
    x, up = inputs["gate"].astype(np.float64), inputs["up"].astype(np.float64)
    f_err = f_max_abs if math == "approx" else 0.0
    bound = 0.5 * np.abs(x) * (f_err + 10 * U) * np.abs(up) + 2 * U * np.abs(want) + 1e-30
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / bound))
