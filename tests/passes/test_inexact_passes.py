"""The inexact passes: FastGelu, one-pass variance, approximate transcendentals, low precision.

Each is off by default, declares the error it may add, and changes the program when it alone is
switched on. Graph-level and pipeline-level checks only (no kernels): the interpreter measures the
numerics of the graph rewrites; the precision-stage passes only annotate group schedules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from scipy import special

from fusiontune.cli import main
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.dump import dump_text
from fusiontune.ir.expand import expand
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.ir.ops import run_reference
from fusiontune.passes.graph import fast_gelu
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import BY_NAME, PASSES, STAGES, lookup

F64 = "float64"
ALL_OFF = {"GraphFusion": False, "UBFusion": False}

INEXACT = {
    "FastGeluPass": ("fast_gelu_fusion", "graph"),
    "OnePassVarianceFusionPass": ("one_pass_variance", "graph"),
    "ApproxTranscendentalFusionPass": ("approx_transcendental", "precision"),
    "LowPrecisionFusionPass": ("enable_low_precision", "precision"),
    "LowPrecisionBf16FusionPass": ("enable_low_precision_bf16", "precision"),
}


# ---- helpers ------------------------------------------------------------------------------------
def only(*names: str, defaults: bool = False) -> FusionConfig:
    """``names`` on; every other switchable pass off (or at its default when ``defaults``)."""
    explicit = dict.fromkeys(names, True)
    if defaults:
        return FusionConfig.resolve(explicit=explicit)
    return FusionConfig.resolve(all_switch=ALL_OFF, explicit=explicit)


def fuse(
    graph: Graph,
    *names: str,
    defaults: bool = False,
    deny: Mapping[str, frozenset[int]] | None = None,
) -> PipelineResult:
    return run_pipeline(graph, only(*names, defaults=defaults), deny=deny)


def build(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], dtype: str = F64) -> Graph:
    g = GraphBuilder("g", dtype=dtype)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def line(kind: str, pass_name: str, pattern: str, matched: int, effected: int) -> str:
    return (
        f"{kind}Pass[{pass_name}]: pattern={pattern}, "
        f"matched_times={matched}, effected_times={effected}"
    )


def max_abs_diff(
    a: Graph, b: Graph, inputs: Mapping[str, np.ndarray], dtype: str | None = F64
) -> float:
    want, got = run_graph(a, inputs, dtype=dtype), run_graph(b, inputs, dtype=dtype)
    assert list(got) == list(want)
    return max(float(np.abs(got[k].astype(F64) - want[k].astype(F64)).max()) for k in want)


def numbers(text: str) -> list[float]:
    """The figures a docstring states: ``4.9e-4``, ``0.5``, and powers of two like ``2^-11``."""
    found = [float(m) for m in re.findall(r"\d+\.?\d*e-\d+|\d+\.\d+", text)]
    return found + [2.0 ** -int(m) for m in re.findall(r"2\^-(\d+)", text)]


# ---- the registry rows --------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(INEXACT))
def test_inexact_rows_are_off_by_default_switchable_and_declare_their_error(name: str) -> None:
    info = BY_NAME[name]
    alias, stage = INEXACT[name]
    assert (info.exact, info.default, info.switchable) == (False, False, True)
    assert info.aliases == (alias,) and lookup(alias) is info and info.stage == stage
    assert 0 < info.expected_error < 1e-2
    doc = info.doc
    assert "Identity" in doc and "Error" in doc and "Preconditions" in doc
    # The docstring states the declared figure (to two significant digits).
    assert any(math.isclose(v, info.expected_error, rel_tol=0.05) for v in numbers(doc)), (
        name,
        numbers(doc),
    )
    assert info.summary.startswith("inexact")
    assert not FusionConfig.defaults().enabled(name)


def test_low_precision_errors_are_the_unit_roundoffs() -> None:
    assert BY_NAME["LowPrecisionFusionPass"].expected_error == 2.0**-11
    assert BY_NAME["LowPrecisionBf16FusionPass"].expected_error == 2.0**-8


def test_inexact_passes_sit_where_the_pipeline_needs_them() -> None:
    names = [p.name for p in PASSES]
    assert names.index("FastGeluPass") == names.index("GeluFusionPass") + 1
    norm = (
        "LayerNormFusionPass",
        "RmsNormFusionPass",
        "AddLayerNormFusionPass",
        "AddRmsNormFusionPass",
    )
    assert names.index("OnePassVarianceFusionPass") > max(names.index(n) for n in norm)
    assert STAGES[-1] == "precision"
    precision = [p.name for p in PASSES if p.stage == "precision"]
    assert precision == [
        "ApproxTranscendentalFusionPass",
        "LowPrecisionFusionPass",
        "LowPrecisionBf16FusionPass",
    ]
    assert all(p.kind == "UBFusion" for p in PASSES if p.stage == "precision")


def test_defaults_do_not_change_with_the_inexact_passes() -> None:
    defaults = FusionConfig.defaults()
    assert [n for n in INEXACT if defaults.enabled(n)] == []
    assert defaults == FusionConfig.resolve(explicit=dict.fromkeys(INEXACT, False))


def test_cli_passes_lists_inexact_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["passes"]) == 0
    header, _, *rows = capsys.readouterr().out.splitlines()
    exact_at = header.index("exact")
    for name in INEXACT:
        row = next(r for r in rows if r.startswith(name + " "))
        assert row[exact_at:].startswith("no ") and "inexact" in row and " off " in row
    assert main(["passes", "--json"]) == 0
    data = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    for name in INEXACT:
        assert (
            data[name]["exact"] is False
            and data[name]["expected_error"] == BY_NAME[name].expected_error
        )


def test_the_precision_stage_is_snapshotted_last() -> None:
    graph = build(lambda g: g.exp(g.input("x", (2, 3))))
    result = fuse(graph, "ApproxTranscendentalFusionPass")
    # An inference graph skips the backward stage (a training step's); every other stage is snapshotted.
    assert [s for s, _ in result.stages] == ["input", *(s for s in STAGES if s != "backward")]


# ---- FastGeluPass -------------------------------------------------------------------------------
def test_measured_gelu_error_constants() -> None:
    x = np.linspace(-10.0, 10.0, 400_001)
    erf = 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))
    tanh = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    diff = np.abs(tanh - erf)
    assert fast_gelu.MAX_ABS_ERROR * 0.999 <= diff.max() <= fast_gelu.MAX_ABS_ERROR
    assert (diff <= fast_gelu.ERROR_PER_UNIT_INPUT * np.abs(x) + 1e-15).all()
    assert BY_NAME["FastGeluPass"].expected_error >= fast_gelu.MAX_ABS_ERROR


def _check_gelu_error(before: Graph, after: Graph) -> None:
    """Unit-scale inputs: the tanh GELU is off by a nonzero amount within the declared error."""
    grid = {"x": np.linspace(-4.0, 4.0, 4 * 8 * 16).reshape(before.values["x"].shape)}
    for inputs in (grid, random_inputs(before, seed=1)):
        err = max_abs_diff(before, after, inputs)
        assert 0 < err <= BY_NAME["FastGeluPass"].expected_error


def test_fast_gelu_rewrites_a_gelu_node() -> None:
    graph = build(lambda g: g.gelu(g.input("x", (32, 16))))
    result = fuse(graph, "FastGeluPass")
    after = result.fused.graph
    (gelu,) = after.nodes
    assert gelu.op == "Gelu" and gelu.attrs["approximate"] == "tanh"
    assert gelu.origin == graph.nodes[0].origin
    assert line("GraphFusion", "FastGeluPass", "FastGelu", 1, 1) in result.report.log_lines()
    (app,) = result.report.applications
    assert (app.pattern, app.nodes, app.applied) == ("FastGelu", (graph.nodes[0].name,), True)
    _check_gelu_error(graph, after)


@pytest.mark.parametrize(
    ("pattern", "write"),
    [
        ("FastGeluErfDiv", lambda g, x: g.gelu_decomposed(x)),
        (
            "FastGeluErfMul",
            lambda g, x: g.mul(g.mul(x, 0.5), g.add(g.erf(g.mul(x, 1.0 / math.sqrt(2.0))), 1.0)),
        ),
    ],
)
def test_fast_gelu_rewrites_the_decomposed_gelu_without_gelu_fusion(
    pattern: str, write: Callable[[GraphBuilder, Tensor], Tensor]
) -> None:
    graph = build(lambda g: write(g, g.input("x", (32, 16))))
    result = fuse(graph, "FastGeluPass")
    assert "GeluFusionPass" not in result.report.passes_run
    after = result.fused.graph
    assert after.op_counts() == {"Gelu": 1}
    assert after.nodes[0].attrs["approximate"] == "tanh"
    assert line("GraphFusion", "FastGeluPass", pattern, 1, 1) in result.report.log_lines()
    (app,) = result.report.applications
    assert set(app.nodes) == {n.name for n in graph.nodes}
    assert set(after.nodes[0].origin) == {n.name for n in graph.nodes}
    _check_gelu_error(graph, after)


def test_fast_gelu_after_gelu_fusion_rewrites_the_fused_node() -> None:
    graph = build(lambda g: g.gelu_decomposed(g.input("x", (32, 16))))
    result = fuse(graph, "GeluFusionPass", "FastGeluPass")
    log = result.report.log_lines()
    assert line("GraphFusion", "GeluFusionPass", "GeluErfDiv", 1, 1) in log
    assert line("GraphFusion", "FastGeluPass", "FastGelu", 1, 1) in log
    assert [n.attrs.get("approximate") for n in result.fused.graph.nodes] == ["tanh"]


def test_fast_gelu_leaves_tanh_gelu_alone_and_honours_deny() -> None:
    tanh = build(lambda g: g.gelu(g.input("x", (4, 4)), approximate="tanh"))
    result = fuse(tanh, "FastGeluPass")
    assert result.report.matched("FastGeluPass") == 0
    assert result.fused.graph.structural_hash() == tanh.structural_hash()

    graph = build(lambda g: (g.gelu(g.input("x", (4, 4))), g.gelu_decomposed(g.input("y", (4, 4)))))
    denied = fuse(graph, "FastGeluPass", deny={"FastGeluPass": frozenset({0})})
    apps = denied.report.applications
    assert [(a.index, a.pattern, a.applied) for a in apps] == [
        (0, "FastGelu", False),
        (1, "FastGeluErfDiv", True),
    ]
    gelus = [n for n in denied.fused.graph.nodes if n.op == "Gelu"]
    assert sorted(n.attrs.get("approximate", "none") for n in gelus) == ["none", "tanh"]


def test_fast_gelu_alone_changes_a_builtin_workload() -> None:
    from fusiontune.workloads.builtin import mlp

    graph = mlp(batch=4, hidden=16)
    plain = run_pipeline(graph, FusionConfig.all_off()).fused.graph
    fast = fuse(graph, "FastGeluPass").fused.graph
    assert plain.structural_hash() != fast.structural_hash()
    assert fast.op_counts().get("Gelu") == 1 and "Erf" not in fast.op_counts()


# ---- OnePassVarianceFusionPass ------------------------------------------------------------------
ROWS, COLS = 8, 32


def _params(g: GraphBuilder) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(3)
    return g.const(1.0 + 0.1 * rng.standard_normal(COLS)), g.const(0.1 * rng.standard_normal(COLS))


def _assert_f64_equal(before: Graph, after: Graph, rtol: float = 1e-9) -> None:
    inputs = random_inputs(before, seed=0)
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=1e-12, err_msg=k)


def test_one_pass_variance_marks_layer_norm() -> None:
    graph = build(lambda g: g.layer_norm(g.input("x", (ROWS, COLS)), *_params(g)))
    result = fuse(graph, "OnePassVarianceFusionPass")
    (ln,) = result.fused.graph.nodes
    assert ln.op == "LayerNorm" and ln.attrs["variance"] == "one_pass"
    assert line("GraphFusion", "OnePassVarianceFusionPass", "OnePassVarianceLayerNorm", 1, 1) in (
        result.report.log_lines()
    )
    _assert_f64_equal(graph, result.fused.graph)


def test_one_pass_variance_marks_add_layer_norm_and_keeps_both_outputs() -> None:
    def write(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        a, b = g.input("a", (ROWS, COLS)), g.input("b", (ROWS, COLS))
        y, s = g.op("AddLayerNorm", a, b, *_params(g), n_outputs=2)
        return y, g.mul(s, 2.0)

    graph = build(write)
    result = fuse(graph, "OnePassVarianceFusionPass")
    (aln,) = [n for n in result.fused.graph.nodes if n.op == "AddLayerNorm"]
    assert aln.attrs["variance"] == "one_pass"
    assert result.report.effected("OnePassVarianceFusionPass") == 1
    _assert_f64_equal(graph, result.fused.graph)


def _decomposed_ln(square: str) -> Callable[[GraphBuilder], Tensor]:
    def write(g: GraphBuilder) -> Tensor:
        x = g.input("x", (ROWS, COLS))
        gamma, beta = _params(g)
        d = g.sub(x, g.reduce_mean(x))
        sq = g.mul(d, d) if square == "Mul" else g.pow(d, 2.0)
        var = g.reduce_mean(sq)
        return g.add(g.mul(g.div(d, g.sqrt(g.add(var, 1e-5))), gamma), beta)

    return write


@pytest.mark.parametrize("square", ["Mul", "Pow"])
def test_one_pass_variance_rewrites_the_decomposed_variance(square: str) -> None:
    graph = build(_decomposed_ln(square))
    result = fuse(graph, "OnePassVarianceFusionPass")
    after = result.fused.graph
    counts = after.op_counts()
    assert counts.get("Pow", 0) == 0 and counts["Maximum"] == 1 and counts["ReduceMean"] == 2
    pattern = "OnePassVarianceMul"  # Pow(d, 2) is Mul(d, d) in canonical form
    assert (
        line("GraphFusion", "OnePassVarianceFusionPass", pattern, 1, 1) in result.report.log_lines()
    )
    (app,) = [a for a in result.report.applications if a.pass_name == "OnePassVarianceFusionPass"]
    assert len(app.nodes) == 4  # mean, centre, square, variance mean
    # x*x is reduced, and d = x - mean still feeds the normalization.
    xx = [n for n in after.nodes if n.op == "Mul" and n.inputs == ("x", "x")]
    assert len(xx) == 1 and any(n.op == "Sub" and n.inputs[0] == "x" for n in after.nodes)
    _assert_f64_equal(graph, after)


def test_one_pass_variance_rewrites_a_centred_rms_norm() -> None:
    """With LayerNormFusionPass off, RmsNormFusionPass turns the decomposed LayerNorm into
    RMSNorm(x - mean): the pass still takes its variance in one sweep."""
    graph = build(_decomposed_ln("Pow"))
    both = fuse(graph, "RmsNormFusionPass", "OnePassVarianceFusionPass")
    assert both.report.effected("RmsNormFusionPass") == 1
    assert (
        line("GraphFusion", "OnePassVarianceFusionPass", "OnePassVarianceCentredRmsNorm", 1, 1)
        in both.report.log_lines()
    )
    counts = both.fused.graph.op_counts()
    assert "RMSNorm" not in counts and counts["Maximum"] == 1 and counts["Rsqrt"] == 1
    _assert_f64_equal(graph, both.fused.graph)
    plain_rms = build(lambda g: g.rms_norm(g.input("x", (ROWS, COLS)), _params(g)[0]))
    assert (
        fuse(plain_rms, "OnePassVarianceFusionPass").report.matched("OnePassVarianceFusionPass")
        == 0
    )


def test_one_pass_variance_with_the_default_passes_marks_the_fused_norms() -> None:
    def write(g: GraphBuilder) -> Tensor:
        x, r = g.input("x", (ROWS, COLS)), g.input("r", (ROWS, COLS))
        return g.layer_norm_decomposed(g.add(x, r), *_params(g))

    graph = build(write)
    result = fuse(graph, "OnePassVarianceFusionPass", defaults=True)
    assert (
        line("GraphFusion", "OnePassVarianceFusionPass", "OnePassVarianceAddLayerNorm", 1, 1)
        in result.report.log_lines()
    )
    assert [
        n.attrs.get("variance") for n in result.fused.graph.nodes if n.op == "AddLayerNorm"
    ] == ["one_pass"]
    _assert_f64_equal(graph, result.fused.graph)


def test_one_pass_variance_leaves_rms_norm_alone_and_honours_deny() -> None:
    def write(g: GraphBuilder) -> tuple[Tensor, ...]:
        x = g.input("x", (ROWS, COLS))
        gamma, beta = _params(g)
        return (
            g.layer_norm(x, gamma, beta),
            g.rms_norm(x, gamma),
            g.layer_norm(g.exp(x), gamma, beta),
        )

    graph = build(write)
    result = fuse(
        graph, "OnePassVarianceFusionPass", deny={"OnePassVarianceFusionPass": frozenset({0})}
    )
    apps = result.report.applications
    assert [(a.index, a.applied) for a in apps] == [(0, False), (1, True)]
    assert [n.attrs.get("variance") for n in result.fused.graph.nodes if n.op == "LayerNorm"] == [
        None,
        "one_pass",
    ]


def _variance_graph(dtype: str) -> Graph:
    """A decomposed row variance as the output."""

    def write(g: GraphBuilder) -> Tensor:
        x = g.input("x", (64, 256))
        d = g.sub(x, g.reduce_mean(x))
        return g.reduce_mean(g.mul(d, d))

    return build(write, dtype=dtype)


def _float32_variance_error(graph: Graph, offset: float) -> float:
    x = (offset + np.random.default_rng(0).standard_normal((64, 256))).astype(np.float32)
    exact = x.astype(F64).var(axis=-1, keepdims=True)
    (got,) = run_graph(graph, {"x": x}, dtype=None).values()
    assert got.dtype == np.float32
    return float((np.abs(got.astype(F64) - exact) / exact).max())


def test_one_pass_variance_loses_accuracy_with_an_offset_in_float32() -> None:
    two = _variance_graph("float32")
    one = fuse(two, "OnePassVarianceFusionPass").fused.graph
    assert one.op_counts()["Maximum"] == 1
    bound = BY_NAME["OnePassVarianceFusionPass"].expected_error
    # Unit-scale rows: both within the declared error.
    assert _float32_variance_error(two, 0.0) <= bound
    assert _float32_variance_error(one, 0.0) <= bound
    # Rows of 1000 + N(0, 1): mean^2 / var = 1e6, and E[x^2] - E[x]^2 cancels.
    assert _float32_variance_error(two, 1000.0) < 1e-5
    assert _float32_variance_error(one, 1000.0) > 1e-2


def test_one_pass_layer_norm_reference_loses_accuracy_with_an_offset() -> None:
    def ln(variance: str) -> Graph:
        def write(g: GraphBuilder) -> Tensor:
            x = g.input("x", (64, 256))
            gamma, beta = g.const(np.ones(256, np.float32)), g.const(np.zeros(256, np.float32))
            return g.op("LayerNorm", x, gamma, beta, variance=variance)

        return build(write, dtype="float32")

    x = (1000.0 + np.random.default_rng(0).standard_normal((64, 256))).astype(np.float32)

    def float32_error(graph: Graph) -> float:
        (want,) = run_graph(graph, {"x": x}).values()
        (got,) = run_graph(graph, {"x": x}, dtype=None).values()
        return float(np.abs(got - want).max())

    assert float32_error(ln("two_pass")) < 1e-3
    assert float32_error(ln("one_pass")) > 1e-2


@pytest.mark.parametrize("op", ["LayerNorm", "AddLayerNorm"])
def test_one_pass_expansion_matches_the_reference(op: str) -> None:
    """The expansion codegen lowers takes E[x] and E[x*x] from the same x, then clamps."""

    def write(g: GraphBuilder) -> Tensor:
        x = g.input("x", (ROWS, COLS))
        if op == "LayerNorm":
            return g.op(op, x, *_params(g), variance="one_pass")
        y, _ = g.op(
            op, x, g.input("r", (ROWS, COLS)), *_params(g), n_outputs=2, variance="one_pass"
        )
        return y

    graph = build(write)
    node = next(n for n in graph.nodes if n.op == op)
    e = expand(node, graph.values)
    means = [n for n in e.stats if n.op == "ReduceMean"]
    assert len(means) == 2 and "Maximum" in [n.op for n in e.stats]
    xx = next(n for n in e.stats if n.outputs[0] == means[1].inputs[0])
    assert xx.op == "Mul" and xx.inputs[0] == xx.inputs[1] == means[0].inputs[0]
    inputs = random_inputs(graph, seed=0)
    env = {**inputs, **graph.constants, **e.constants}
    for n in e.nodes:
        env.update(zip(n.outputs, run_reference(n, [env[i] for i in n.inputs]), strict=True))
    (want,) = run_graph(graph, inputs).values()
    np.testing.assert_allclose(env[node.outputs[0]], want, rtol=1e-9, atol=1e-12)


# ---- the precision stage ------------------------------------------------------------------------
def _kernels_graph(dtype: str = "float32") -> Graph:
    """Exp, Mul, Tanh, MatMul, Softmax, Reshape, Add: transcendental, plain, contraction, layout."""

    def write(g: GraphBuilder) -> Tensor:
        x = g.input("x", (4, 8))
        w = g.const(np.random.default_rng(0).standard_normal((8, 8)) * 0.3)
        h = g.tanh(g.mul(g.exp(x), 2.0))
        s = g.softmax(g.matmul(h, w))
        return g.add(g.reshape(s, (8, 4)), 1.0)

    return build(write, dtype=dtype)


def _schedules(result: PipelineResult, key: str) -> dict[tuple[str, ...], object]:
    graph = result.fused.graph
    return {
        tuple(graph.node(n).op for n in g.nodes): g.schedule.get(key) for g in result.fused.groups
    }


APPROX = "ApproxTranscendentalFusionPass"
FP16 = "LowPrecisionFusionPass"
BF16 = "LowPrecisionBf16FusionPass"


def test_approx_transcendental_marks_the_groups_it_changes() -> None:
    """float32: the Tanh group only (a float32 exp is the same under either math); float64: every
    group with exp, tanh, sigmoid or erf."""
    result = fuse(_kernels_graph(), APPROX)
    assert _schedules(result, "math") == {
        ("Exp",): None,
        ("Mul",): None,
        ("Tanh",): "approx",
        ("MatMul",): None,
        ("Softmax",): None,
        ("Reshape",): None,
        ("Add",): None,
    }
    assert [(a.index, a.pattern, a.applied) for a in result.report.applications] == [
        (0, "ApproxTranscendental", True)
    ]
    assert line("UBFusion", APPROX, "ApproxTranscendental", 1, 1) in result.report.log_lines()
    result = fuse(_kernels_graph("float64"), APPROX)
    assert _schedules(result, "math") == {
        ("Exp",): "approx",
        ("Mul",): None,
        ("Tanh",): "approx",
        ("MatMul",): None,
        ("Softmax",): "approx",
        ("Reshape",): None,
        ("Add",): None,
    }
    marked = [g for g in result.fused.groups if "math" in g.schedule]
    assert all(g.passes[-1] == APPROX for g in marked)
    apps = result.report.applications
    assert [(a.index, a.pattern, a.applied) for a in apps] == [
        (0, "ApproxTranscendental", True),
        (1, "ApproxTranscendental", True),
        (2, "ApproxTranscendental", True),
    ]
    assert line("UBFusion", APPROX, "ApproxTranscendental", 3, 3) in result.report.log_lines()
    assert "kernel Exp_0 [ApproxTranscendentalFusionPass] {math='approx'}:" in dump_text(
        result.fused
    )


def test_approx_transcendental_marks_every_fused_group_with_such_an_op() -> None:
    from fusiontune.passes.ub.approx_transcendental import changes
    from fusiontune.workloads.builtin import transformer_block

    graph = transformer_block(batch=1, seq=8, hidden=16, heads=2, ffn=32)
    result = fuse(graph, APPROX, defaults=True)
    fused = result.fused
    expect = [
        any(changes(fused.graph.node(n).op, fused.graph.values[fused.graph.node(n).outputs[0]].dtype)
            for n in g.nodes)
        for g in fused.groups
    ]
    assert any(expect) and not all(expect)
    assert [g.schedule.get("math") == "approx" for g in fused.groups] == expect
    assert result.report.effected(APPROX) == sum(expect)
    # The exact passes group as before: the pass only annotates.
    plain = run_pipeline(graph, FusionConfig.defaults()).fused
    assert [g.nodes for g in fused.groups] == [g.nodes for g in plain.groups]


@pytest.mark.parametrize("name", [APPROX, FP16, BF16])
def test_precision_passes_honour_deny_with_stable_indices(name: str) -> None:
    graph = _kernels_graph("float64" if name == APPROX else "float32")
    key = "math" if name == APPROX else "precision"
    full = fuse(graph, name)
    marked = [g.name for g in full.fused.groups if key in g.schedule]
    assert len(marked) >= 3 and [a.index for a in full.report.applications] == list(
        range(len(marked))
    )
    denied = fuse(graph, name, deny={name: frozenset({1})})
    apps = denied.report.applications
    assert [(a.index, a.applied) for a in apps] == [(i, i != 1) for i in range(len(marked))]
    # Same groups, same origins, same order: only group 1 is left unmarked.
    assert [a.nodes for a in apps] == [a.nodes for a in full.report.applications]
    still = [g.name for g in denied.fused.groups if key in g.schedule]
    assert still == [n for i, n in enumerate(marked) if i != 1]
    assert denied.report.effected(name) == len(marked) - 1


def test_low_precision_marks_loop_nest_kernels_only() -> None:
    result = fuse(_kernels_graph(), FP16)
    assert _schedules(result, "precision") == {
        ("Exp",): "float16",
        ("Mul",): "float16",
        ("Tanh",): "float16",
        ("MatMul",): None,
        ("Softmax",): "float16",
        ("Reshape",): None,
        ("Add",): "float16",
    }
    bf16 = fuse(_kernels_graph(), BF16)
    assert {v for v in _schedules(bf16, "precision").values()} == {"bfloat16", None}
    assert line("UBFusion", BF16, "LowPrecision", 5, 5) in bf16.report.log_lines()


def test_low_precision_skips_groups_with_nothing_to_narrow() -> None:
    def write(g: GraphBuilder) -> Tensor:
        x = g.input("x", (4, 4), dtype="float16")
        return g.add(g.mul(x, 2.0), 1.0)

    result = fuse(build(write, dtype="float16"), FP16)
    assert result.report.matched(FP16) == 0


def test_low_precision_on_fused_groups() -> None:
    from fusiontune.passes.ub.low_precision import eligible
    from fusiontune.workloads.builtin import transformer_block

    graph = transformer_block(batch=1, seq=8, hidden=16, heads=2, ffn=32)
    result = fuse(graph, FP16, defaults=True)
    fused = result.fused
    expect = [eligible(fused.graph, g) for g in fused.groups]
    assert any(expect) and not all(expect)
    assert [g.schedule.get("precision") == "float16" for g in fused.groups] == expect
    for g in fused.groups:
        ops = {fused.graph.node(n).op for n in g.nodes}
        if "MatMul" in ops or ops & {"Reshape", "Transpose", "Concat", "Split", "Slice"}:
            assert "precision" not in g.schedule


def test_float16_runs_first_and_bfloat16_skips_its_groups() -> None:
    graph = _kernels_graph()
    both = fuse(graph, FP16, BF16)
    assert {v for v in _schedules(both, "precision").values()} == {"float16", None}
    assert both.report.matched(BF16) == 0
    # A group whose float16 application is denied is unmarked, so the bfloat16 pass takes it.
    denied = fuse(graph, FP16, BF16, deny={FP16: frozenset({0})})
    sched = _schedules(denied, "precision")
    assert sched[("Exp",)] == "bfloat16" and sched[("Mul",)] == "float16"
    assert denied.report.effected(BF16) == 1


def test_precision_passes_compose() -> None:
    result = fuse(_kernels_graph(), APPROX, FP16)
    (tanh,) = [g for g in result.fused.groups if result.fused.graph.node(g.nodes[0]).op == "Tanh"]
    assert dict(tanh.schedule) == {"math": "approx", "precision": "float16"}
    assert tanh.passes == (APPROX, FP16)


def test_add_layer_norm_fusion_keeps_the_variance_mode() -> None:
    def write(g: GraphBuilder) -> Tensor:
        s = g.add(g.input("a", (ROWS, COLS)), g.input("b", (ROWS, COLS)))
        return g.op("LayerNorm", s, *_params(g), variance="one_pass")

    graph = build(write)
    result = fuse(graph, "AddLayerNormFusionPass")
    (aln,) = result.fused.graph.nodes
    assert aln.op == "AddLayerNorm" and aln.attrs["variance"] == "one_pass"
    _assert_f64_equal(graph, result.fused.graph)
