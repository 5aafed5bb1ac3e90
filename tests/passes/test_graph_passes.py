"""GraphFusion passes: before/after op counts, interpreter equality, CANN log lines, deny."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.passes.base import GRAPH_FUSION, PassContext, PassInfo
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import BY_NAME, lookup, passes_of_kind

F64 = "float64"


# ---- helpers ------------------------------------------------------------------------------------
def fuse(
    graph: Graph, pass_name: str, deny: Mapping[str, frozenset[int]] | None = None
) -> PipelineResult:
    """Run the pipeline with only ``pass_name`` on (plus the non-switchable canonicalization)."""
    config = FusionConfig.resolve(
        all_switch={"GraphFusion": False, "UBFusion": False}, explicit={pass_name: True}
    )
    return run_pipeline(graph, config, deny=deny)


def assert_same_outputs(before: Graph, after: Graph, rtol: float = 1e-9) -> None:
    inputs = random_inputs(before, seed=0)
    want = run_graph(before, inputs)
    got = run_graph(after, inputs)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12, err_msg=name)


def line(pass_name: str, pattern: str, matched: int, effected: int) -> str:
    return (
        f"GraphFusionPass[{pass_name}]: pattern={pattern}, "
        f"matched_times={matched}, effected_times={effected}"
    )


def build(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], name: str = "g") -> Graph:
    g = GraphBuilder(name, dtype=F64)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def check_fused(
    graph: Graph, pass_name: str, pattern: str, counts: Mapping[str, int], matches: int = 1
) -> Graph:
    """Fuse, then check op counts, the log line and interpreter equality; return the result."""
    result = fuse(graph, pass_name)
    after = result.fused.graph
    for op, n in counts.items():
        assert after.op_counts().get(op, 0) == n, (op, after.op_counts())
    assert line(pass_name, pattern, matches, matches) in result.report.log_lines()
    assert_same_outputs(graph, after)
    return after


def seen_by(graph: Graph, pass_name: str) -> Graph:
    """The graph ``pass_name`` rewrites: ``graph`` itself for a pass of the canonicalize stage,
    else ``graph`` in canonical form (the canonicalize stage always runs first)."""
    if BY_NAME[pass_name].stage == "canonicalize":
        return graph
    canonical_only = FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False})
    return run_pipeline(graph, canonical_only).fused.graph


def check_unchanged(graph: Graph, pass_name: str) -> None:
    result = fuse(graph, pass_name)
    assert result.report.matched(pass_name) == 0
    assert result.fused.graph.structural_hash() == seen_by(graph, pass_name).structural_hash()


def check_denied(graph: Graph, pass_name: str) -> None:
    result = fuse(graph, pass_name, deny={pass_name: frozenset({0})})
    assert result.report.matched(pass_name) == 1
    assert result.report.effected(pass_name) == 0
    assert result.fused.graph.structural_hash() == seen_by(graph, pass_name).structural_hash()
    assert [a.applied for a in result.report.applications if a.pass_name == pass_name] == [False]


# ---- the registry contract ----------------------------------------------------------------------
@pytest.mark.parametrize("info", passes_of_kind(GRAPH_FUSION), ids=lambda p: p.name)
def test_graph_pass_loads_with_patterns_and_docstring(info: PassInfo) -> None:
    fn = info.load()
    assert fn.patterns, info.name
    assert "Preconditions" in info.doc and "Identit" in info.doc


@pytest.mark.parametrize("info", passes_of_kind(GRAPH_FUSION), ids=lambda p: p.name)
def test_graph_pass_returns_input_when_nothing_matches(info: PassInfo) -> None:
    graph = build(lambda g: g.relu(g.input("x", (2, 3))))
    ctx = PassContext(config=FusionConfig.defaults())
    ctx.begin(info)
    assert info.load()(graph, ctx) is graph


# ---- ConstantFoldingPass ------------------------------------------------------------------------
def test_constant_folding_folds_constant_chains() -> None:
    def net(g: GraphBuilder) -> Tensor:
        c = g.mul(g.sqrt(g.const(np.array([4.0, 9.0, 16.0]))), 2.0)
        return g.add(g.input("x", (2, 3)), c)

    graph = build(net)
    after = check_fused(
        graph, "ConstantFoldingPass", "ConstantFolding", {"Sqrt": 0, "Mul": 0, "Add": 1}, 2
    )
    folded = after.node("Add_0").inputs[1]
    np.testing.assert_array_equal(after.constants[folded], [4.0, 6.0, 8.0])


def test_constant_folding_keeps_the_declared_dtype() -> None:
    g = GraphBuilder("f32")
    x = g.input("x", (3,))
    g.output(g.add(x, g.div(g.const(np.float32(1.0)), g.const(np.float32(3.0)))))
    after = fuse(g.build(), "ConstantFoldingPass").fused.graph
    (c,) = after.constants.values()
    assert c.dtype == np.float32 and c == np.float32(1.0 / 3.0)


def test_constant_folding_leaves_a_growing_broadcast_to_run() -> None:
    big = build(
        lambda g: g.add(g.input("x", (300, 300)), g.expand(g.const(np.ones(1)), (300, 300)))
    )
    check_unchanged(big, "ConstantFoldingPass")


def test_constant_folding_keeps_nodes_that_read_inputs() -> None:
    check_unchanged(build(lambda g: g.mul(g.input("x", (2, 3)), 2.0)), "ConstantFoldingPass")


def test_constant_folding_deny_keeps_the_node() -> None:
    check_denied(
        build(lambda g: g.add(g.input("x", (3,)), g.neg(g.const(np.ones(3))))),
        "ConstantFoldingPass",
    )


# ---- IdentityEliminationPass --------------------------------------------------------------------
def test_identity_elimination_drops_every_no_op() -> None:
    def net(g: GraphBuilder) -> Tensor:
        x = g.relu(g.input("x", (4, 4)))
        y = g.transpose(g.reshape(x, (4, 4)), (0, 1))
        y = g.expand(g.cast(y, F64), (4, 4))
        y = g.div(g.sub(g.add(0.0, g.mul(1.0, g.mul(y, 1.0))), 0.0), 1.0)
        return g.exp(y)

    graph = build(net)
    counts = {
        op: 0 for op in ("Reshape", "Transpose", "Cast", "Expand", "Mul", "Add", "Sub", "Div")
    }
    after = check_fused(graph, "IdentityEliminationPass", "ArithIdentity", {**counts, "Exp": 1}, 5)
    assert len(after.nodes) == 2
    log = fuse(graph, "IdentityEliminationPass").report.log_lines()
    assert line("IdentityEliminationPass", "NoOpTranspose", 1, 1) in log


def test_identity_elimination_keeps_graph_output_names() -> None:
    graph = build(lambda g: g.reshape(g.relu(g.input("x", (2, 3))), (2, 3)))
    after = check_fused(graph, "IdentityEliminationPass", "NoOpReshape", {"Reshape": 0})
    assert after.outputs == graph.outputs
    # An output that would become a graph input keeps its node.
    check_unchanged(
        build(lambda g: g.reshape(g.input("x", (2, 3)), (2, 3))), "IdentityEliminationPass"
    )


def test_identity_elimination_keeps_real_work() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("x", (4, 4))
        y = g.mul(g.transpose(x, (1, 0)), 1.0000001)
        y = g.add(g.reshape(y, (16,)), g.const(np.zeros((2, 16))))  # broadcasts to (2, 16)
        return y, g.cast(g.mul(g.input("k", (16,), dtype="int64"), 1.0), "float32")  # promotes

    graph = build(net)
    check_unchanged(graph, "IdentityEliminationPass")


def test_identity_elimination_deny_keeps_the_node() -> None:
    check_denied(build(lambda g: g.exp(g.mul(g.input("x", (3,)), 1.0))), "IdentityEliminationPass")


# ---- MatMulBiasAddFusionPass --------------------------------------------------------------------
def _linear(g: GraphBuilder, bias: str) -> Tensor:
    y = g.matmul(g.input("a", (2, 4, 8)), g.const(np.random.default_rng(1).standard_normal((8, 5))))
    if bias == "biasadd":
        return g.bias_add(y, g.input("b", (5,)))
    if bias == "add_row":
        return g.add(g.const(np.arange(5.0).reshape(1, 5)), y)
    return g.add(y, g.const(np.arange(5.0)))


@pytest.mark.parametrize(
    ("bias", "pattern"),
    [("biasadd", "MatMulBiasAdd"), ("add", "MatMulAdd"), ("add_row", "MatMulAdd")],
)
def test_matmul_bias_add_fuses_the_bias(bias: str, pattern: str) -> None:
    graph = build(lambda g: _linear(g, bias))
    after = check_fused(
        graph, "MatMulBiasAddFusionPass", pattern, {"MatMul": 1, "Add": 0, "BiasAdd": 0}
    )
    (mm,) = after.nodes
    assert len(mm.inputs) == 3 and mm.outputs == graph.outputs
    assert set(mm.origin) == {n.name for n in graph.nodes}


def test_matmul_bias_add_needs_an_exclusive_output_and_a_vector() -> None:
    def shared(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        y = g.matmul(g.input("a", (4, 8)), g.input("w", (8, 5)))
        return g.add(y, g.const(np.ones(5))), y

    check_unchanged(build(shared), "MatMulBiasAddFusionPass")
    full = build(
        lambda g: g.add(
            g.matmul(g.input("a", (4, 8)), g.input("w", (8, 5))), g.const(np.ones((4, 5)))
        )
    )
    check_unchanged(full, "MatMulBiasAddFusionPass")


def test_matmul_bias_add_deny_keeps_the_graph() -> None:
    check_denied(build(lambda g: _linear(g, "add")), "MatMulBiasAddFusionPass")


# ---- GeluFusionPass -----------------------------------------------------------------------------
SQRT2 = float(np.sqrt(2.0))
INV_SQRT2 = 0.7071067811865476
GELU_FORMS: dict[str, tuple[str, Callable[[GraphBuilder, Tensor], Tensor]]] = {
    "builder": ("GeluErfDiv", lambda g, x: g.gelu_decomposed(x)),
    "mul_inv_sqrt2": (
        "GeluErfMul",
        lambda g, x: g.mul(g.mul(x, 0.5), g.add(g.erf(g.mul(x, INV_SQRT2)), 1.0)),
    ),
    "x_times_half_t": (
        "GeluErfDiv",
        lambda g, x: g.mul(x, g.mul(0.5, g.add(1.0, g.erf(g.div(x, SQRT2))))),
    ),
    "half_times_x_t": (
        "GeluErfMul",
        lambda g, x: g.mul(0.5, g.mul(g.add(g.erf(g.mul(INV_SQRT2, x)), 1.0), x)),
    ),
    "t_times_half_x": (
        "GeluErfDiv",
        lambda g, x: g.mul(g.add(1.0, g.erf(g.div(x, SQRT2))), g.mul(0.5, x)),
    ),
}


@pytest.mark.parametrize("form", sorted(GELU_FORMS))
def test_gelu_fuses_every_erf_form(form: str) -> None:
    pattern, fn = GELU_FORMS[form]
    graph = build(lambda g: fn(g, g.relu(g.input("x", (3, 7)))))
    counts = {"Gelu": 1, "Relu": 1, "Erf": 0, "Mul": 0, "Add": 0, "Div": 0}
    after = check_fused(graph, "GeluFusionPass", pattern, counts)
    gelu = next(n for n in after.nodes if n.op == "Gelu")
    assert dict(gelu.attrs) == {} and len(gelu.origin) == len(graph.nodes) - 1


def test_gelu_fused_graph_equals_the_hand_written_one() -> None:
    fused = fuse(
        build(lambda g: g.gelu_decomposed(g.input("x", (3, 7)))), "GeluFusionPass"
    ).fused.graph
    assert (
        fused.structural_hash() == build(lambda g: g.gelu(g.input("x", (3, 7)))).structural_hash()
    )


def test_gelu_needs_exclusive_intermediates_and_the_right_constants() -> None:
    def shared_erf(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("x", (3, 7))
        e = g.erf(g.div(x, SQRT2))
        return g.mul(g.mul(x, 0.5), g.add(e, 1.0)), e

    check_unchanged(build(shared_erf), "GeluFusionPass")
    wrong = build(
        lambda g: g.mul(
            g.mul(g.input("x", (3, 7)), 0.6), g.add(g.erf(g.div(g.input("y", (3, 7)), SQRT2)), 1.0)
        )
    )
    check_unchanged(wrong, "GeluFusionPass")


def test_gelu_deny_keeps_the_graph() -> None:
    check_denied(build(lambda g: g.gelu_decomposed(g.input("x", (3, 7)))), "GeluFusionPass")


SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
KAPPA = 0.044715


def _tanh_gelu(
    inner: Callable[[GraphBuilder, Tensor], Tensor], outer: str
) -> Callable[[GraphBuilder, Tensor], Tensor]:
    """0.5 * x * (1 + tanh(inner(x))) with the three factors grouped as ``outer`` says."""

    def write(g: GraphBuilder, x: Tensor) -> Tensor:
        if outer == "half_last":  # TorchScript, F.gelu(approximate="tanh"): 0.5 * (x * (1 + t))
            return g.mul(0.5, g.mul(x, g.add(1.0, g.tanh(inner(g, x)))))
        t = g.add(g.tanh(inner(g, x)), 1.0)
        if outer == "half_x_first":  # GPT-2 gelu_new / T5: (0.5 * x) * (t + 1)
            return g.mul(g.mul(x, 0.5), t)
        return g.mul(x, g.mul(t, 0.5))  # torch.onnx dynamo at opset 18: x * ((t + 1) * 0.5)

    return write


def _pow_cube(g: GraphBuilder, x: Tensor) -> Tensor:
    return g.mul(g.add(x, g.mul(g.pow(x, 3.0), KAPPA)), SQRT_2_OVER_PI)


def _mul_cube(g: GraphBuilder, x: Tensor) -> Tensor:
    return g.mul(SQRT_2_OVER_PI, g.add(x, g.mul(KAPPA, g.mul(x, g.mul(x, x)))))


def _kappa_first_cube(g: GraphBuilder, x: Tensor) -> Tensor:
    return g.mul(g.add(g.mul(g.mul(g.mul(KAPPA, x), x), x), x), SQRT_2_OVER_PI)


def _megatron(g: GraphBuilder, x: Tensor) -> Tensor:
    return g.mul(g.mul(SQRT_2_OVER_PI, x), g.add(1.0, g.mul(g.mul(KAPPA, x), x)))


GELU_TANH_FORMS: dict[str, Callable[[GraphBuilder, Tensor], Tensor]] = {
    "gelu_new": _tanh_gelu(_pow_cube, "half_x_first"),
    "torchscript_tanh": _tanh_gelu(_mul_cube, "half_last"),
    "dynamo_opset18": _tanh_gelu(_pow_cube, "x_first"),
    "kappa_first_cube": _tanh_gelu(_kappa_first_cube, "half_x_first"),
    "megatron": _tanh_gelu(_megatron, "x_first"),
}


@pytest.mark.parametrize("form", sorted(GELU_TANH_FORMS))
def test_gelu_fuses_every_tanh_form(form: str) -> None:
    graph = build(lambda g: GELU_TANH_FORMS[form](g, g.relu(g.input("x", (3, 7)))))
    counts = {"Gelu": 1, "Relu": 1, "Tanh": 0, "Pow": 0, "Mul": 0, "Add": 0}
    after = check_fused(graph, "GeluFusionPass", "GeluTanh", counts)
    gelu = next(n for n in after.nodes if n.op == "Gelu")
    assert dict(gelu.attrs) == {"approximate": "tanh"}


def test_gelu_tanh_with_float32_constants_of_an_export() -> None:
    """gpt2.dynamo.onnx's constants: 0.044714998453855515, 0.7978845834732056 (float32)."""
    g = GraphBuilder("f32")
    g.output(GELU_TANH_FORMS["gelu_new"](g, g.input("x", (4, 8))))
    graph = g.build()
    after = fuse(graph, "GeluFusionPass").fused.graph
    assert after.op_counts() == {"Gelu": 1}
    inputs = random_inputs(graph, seed=0)
    got, want = run_graph(after, inputs, dtype=None), run_graph(graph, inputs, dtype=None)
    np.testing.assert_allclose(got[graph.outputs[0]], want[graph.outputs[0]], rtol=1e-5, atol=1e-6)


def test_gelu_tanh_needs_its_constants() -> None:
    def wrong_kappa(g: GraphBuilder) -> Tensor:
        x = g.input("x", (3, 7))
        inner = g.mul(g.add(x, g.mul(g.pow(x, 3.0), 0.05)), SQRT_2_OVER_PI)
        return g.mul(g.mul(x, 0.5), g.add(g.tanh(inner), 1.0))

    check_unchanged(build(wrong_kappa), "GeluFusionPass")


# ---- SoftmaxFusionPass --------------------------------------------------------------------------
def _softmax(g: GraphBuilder, x: Tensor, axis: int) -> Tensor:
    e = g.exp(g.sub(x, g.reduce_max(x, axis)))
    return g.div(e, g.reduce_sum(e, axis))


@pytest.mark.parametrize(("axis", "attrs"), [(-1, {}), (2, {}), (1, {"axis": 1}), (0, {"axis": 0})])
def test_softmax_fuses_any_single_axis(axis: int, attrs: dict[str, int]) -> None:
    graph = build(lambda g: _softmax(g, g.input("x", (2, 3, 5)), axis))
    after = check_fused(graph, "SoftmaxFusionPass", "Softmax", {"Softmax": 1, "Exp": 0, "Div": 0})
    (node,) = after.nodes
    assert dict(node.attrs) == attrs and node.outputs == graph.outputs


def test_softmax_needs_exclusive_intermediates_and_one_axis() -> None:
    def exp_escapes(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("x", (2, 5))
        e = g.exp(g.sub(x, g.reduce_max(x)))
        return g.div(e, g.reduce_sum(e)), e

    check_unchanged(build(exp_escapes), "SoftmaxFusionPass")

    def mixed_axes(g: GraphBuilder) -> Tensor:
        x = g.input("x", (2, 5))
        e = g.exp(g.sub(x, g.reduce_max(x, 0)))
        return g.div(e, g.reduce_sum(e, 1))

    check_unchanged(build(mixed_axes), "SoftmaxFusionPass")


def test_softmax_deny_keeps_the_graph() -> None:
    graph = build(lambda g: g.softmax_decomposed(g.input("x", (2, 5))))
    check_denied(graph, "SoftmaxFusionPass")


def test_softmax_chain_fuses_twice_with_stable_application_ids() -> None:
    graph = build(lambda g: g.softmax_decomposed(g.softmax_decomposed(g.input("x", (2, 5)))))
    after = check_fused(graph, "SoftmaxFusionPass", "Softmax", {"Softmax": 2}, 2)
    assert len(after.nodes) == 2
    result = fuse(graph, "SoftmaxFusionPass", deny={"SoftmaxFusionPass": frozenset({1})})
    assert result.fused.graph.op_counts()["Softmax"] == 1
    apps = [
        (a.index, a.applied, a.nodes[0])
        for a in result.report.applications
        if a.pass_name == "SoftmaxFusionPass"
    ]
    assert apps == [(0, True, "ReduceMax_0"), (1, False, "ReduceMax_1")]


# ---- LayerNormFusionPass ------------------------------------------------------------------------
N = 6


def _layer_norm_variant(
    g: GraphBuilder, x: Tensor, square: str, root: str, gamma: Tensor | None, beta: Tensor | None
) -> Tensor:
    d = g.sub(x, g.reduce_mean(x))
    var = g.reduce_mean(g.pow(d, 2.0) if square == "Pow" else g.mul(d, d))
    s = g.add(1e-5, var)
    y = g.div(d, g.sqrt(s)) if root == "Sqrt" else g.mul(g.rsqrt(s), d)
    if gamma is not None:
        y = g.mul(gamma, y)
    if beta is not None:
        y = g.add(y, beta)
    return y


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("root", ["Sqrt", "Rsqrt"])
@pytest.mark.parametrize("params", ["const", "input", "none", "gamma_only", "beta_only"])
def test_layer_norm_fuses_every_variant(square: str, root: str, params: str) -> None:
    def net(g: GraphBuilder) -> Tensor:
        x = g.input("x", (3, N))
        rng = np.random.default_rng(2)
        if params == "input":
            gamma, beta = g.input("gamma", (N,)), g.input("beta", (N,))
        else:
            gamma, beta = g.const(rng.standard_normal(N)), g.const(rng.standard_normal(N))
        return _layer_norm_variant(
            g,
            x,
            square,
            root,
            None if params in ("none", "beta_only") else gamma,
            None if params in ("none", "gamma_only") else beta,
        )

    graph = build(net)
    after = check_fused(
        graph,
        "LayerNormFusionPass",
        "LayerNormMulSqrt",  # every spelling, in canonical form
        {"LayerNorm": 1, "ReduceMean": 0, "Add": 0, "Mul": 0},
    )
    (ln,) = after.nodes
    assert dict(ln.attrs) == {} and len(ln.origin) == len(graph.nodes)


def test_layer_norm_fuses_the_builder_form_with_its_eps() -> None:
    def net(g: GraphBuilder) -> Tensor:
        return g.layer_norm_decomposed(
            g.input("x", (2, 3, N)), g.const(np.full(N, 2.0)), g.const(np.ones(N)), eps=1e-3
        )

    after = check_fused(
        build(net), "LayerNormFusionPass", "LayerNormMulSqrt", {"LayerNorm": 1, "Sub": 0, "Sqrt": 0}
    )
    (ln,) = after.nodes
    assert ln.attr("eps") == 1e-3


def test_layer_norm_eps_keeps_its_float32_spelling() -> None:
    g = GraphBuilder("f32")
    g.output(
        g.layer_norm_decomposed(
            g.input("x", (2, N)), g.const(np.ones(N, np.float32)), g.const(np.zeros(N, np.float32))
        )
    )
    (ln,) = fuse(g.build(), "LayerNormFusionPass").fused.graph.nodes
    assert ln.op == "LayerNorm" and dict(ln.attrs) == {}  # eps 1e-5, the default


def test_layer_norm_needs_exclusive_intermediates_and_the_last_axis() -> None:
    def centred_escapes(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("x", (3, N))
        d = g.sub(x, g.reduce_mean(x))
        var = g.reduce_mean(g.pow(d, 2.0))
        return g.div(d, g.sqrt(g.add(var, 1e-5))), g.exp(d)

    check_unchanged(build(centred_escapes), "LayerNormFusionPass")

    def first_axis(g: GraphBuilder) -> Tensor:
        x = g.input("x", (3, N))
        d = g.sub(x, g.reduce_mean(x, 0))
        return g.div(d, g.sqrt(g.add(g.reduce_mean(g.mul(d, d), 0), 1e-5)))

    check_unchanged(build(first_axis), "LayerNormFusionPass")


def test_layer_norm_leaves_a_full_shape_scale_outside() -> None:
    def net(g: GraphBuilder) -> Tensor:
        x = g.input("x", (3, N))
        return g.mul(
            g.layer_norm_decomposed(x, g.const(np.ones(N)), g.const(np.zeros(N))),
            g.input("s", (3, N)),
        )

    after = check_fused(
        build(net), "LayerNormFusionPass", "LayerNormMulSqrt", {"LayerNorm": 1, "Mul": 1}
    )
    assert after.nodes[-1].op == "Mul"


def test_layer_norm_fuses_a_centre_written_twice() -> None:
    """``(x - u) / sqrt(((x - u) * (x - u)).mean() + eps)``: torch code that repeats ``x - u``."""

    def net(g: GraphBuilder) -> Tensor:
        x = g.input("x", (3, N))
        u = g.reduce_mean(x)
        var = g.reduce_mean(g.mul(g.sub(x, u), g.sub(x, u)))
        return g.add(g.mul(g.div(g.sub(x, u), g.sqrt(g.add(var, 1e-6))), g.input("w", (N,))), 0.5)

    after = check_fused(
        build(net), "LayerNormFusionPass", "LayerNormMulSqrt", {"LayerNorm": 1, "Sub": 0, "Add": 1}
    )
    (ln, _) = after.nodes
    assert ln.op == "LayerNorm" and ln.inputs[:2] == ("x", "w") and ln.attr("eps") == 1e-6


def test_layer_norm_deny_keeps_the_graph() -> None:
    graph = build(
        lambda g: g.layer_norm_decomposed(
            g.input("x", (3, N)), g.input("gamma", (N,)), g.input("beta", (N,))
        )
    )
    check_denied(graph, "LayerNormFusionPass")


# ---- RmsNormFusionPass --------------------------------------------------------------------------
def _rms_variant(
    g: GraphBuilder, x: Tensor, square: str, root: str, gamma: Tensor | None
) -> Tensor:
    ms = g.reduce_mean(g.mul(x, x) if square == "Mul" else g.pow(x, 2.0))
    s = g.add(ms, 1e-6)
    y = g.mul(x, g.rsqrt(s)) if root == "Rsqrt" else g.div(x, g.sqrt(s))
    return y if gamma is None else g.mul(y, gamma)


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("root", ["Sqrt", "Rsqrt"])
@pytest.mark.parametrize("gamma", [True, False])
def test_rms_norm_fuses_every_variant(square: str, root: str, gamma: bool) -> None:
    def net(g: GraphBuilder) -> Tensor:
        x = g.relu(g.input("x", (2, 3, N)))
        return _rms_variant(g, x, square, root, g.input("gamma", (N,)) if gamma else None)

    graph = build(net)
    after = check_fused(
        graph,
        "RmsNormFusionPass",
        "RmsNormMulSqrt",  # every spelling, in canonical form
        {"RMSNorm": 1, "ReduceMean": 0, "Mul": 0},
    )
    rms = after.nodes[-1]
    assert rms.op == "RMSNorm" and dict(rms.attrs) == {}


def test_rms_norm_fused_graph_equals_the_hand_written_one() -> None:
    def decomposed(g: GraphBuilder) -> Tensor:
        return g.rms_norm_decomposed(g.input("x", (4, N)), g.input("gamma", (N,)), eps=1e-5)

    fused = fuse(build(decomposed), "RmsNormFusionPass").fused.graph
    direct = build(lambda g: g.rms_norm(g.input("x", (4, N)), g.input("gamma", (N,)), eps=1e-5))
    assert fused.structural_hash() == direct.structural_hash()


def test_rms_norm_needs_exclusive_intermediates() -> None:
    def rsqrt_escapes(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("x", (4, N))
        r = g.rsqrt(g.add(g.reduce_mean(g.mul(x, x)), 1e-6))
        return g.mul(x, r), r

    check_unchanged(build(rsqrt_escapes), "RmsNormFusionPass")


def test_rms_norm_deny_keeps_the_graph() -> None:
    graph = build(lambda g: g.rms_norm_decomposed(g.input("x", (4, N)), g.input("gamma", (N,))))
    check_denied(graph, "RmsNormFusionPass")


# ---- AddLayerNormFusionPass / AddRmsNormFusionPass ----------------------------------------------
def _residual_norm(g: GraphBuilder, kind: str, sum_escapes: bool) -> tuple[Tensor, ...]:
    a, b = g.input("a", (3, N)), g.relu(g.input("b", (3, N)))
    s = g.add(a, b)
    gamma = g.const(np.linspace(0.5, 1.5, N))
    y = (
        g.layer_norm(s, gamma, g.const(np.zeros(N)), eps=1e-4)
        if kind == "ln"
        else g.rms_norm(s, gamma)
    )
    return (y, g.exp(s)) if sum_escapes else (y,)


@pytest.mark.parametrize(
    ("kind", "pass_name", "op"),
    [
        ("ln", "AddLayerNormFusionPass", "AddLayerNorm"),
        ("rms", "AddRmsNormFusionPass", "AddRmsNorm"),
    ],
)
@pytest.mark.parametrize("sum_escapes", [False, True])
def test_add_norm_fuses_the_residual_add(
    kind: str, pass_name: str, op: str, sum_escapes: bool
) -> None:
    graph = build(lambda g: _residual_norm(g, kind, sum_escapes))
    after = check_fused(
        graph,
        pass_name,
        op,
        {op: 1, "Add": 0, "LayerNorm": 0, "RMSNorm": 0, "Exp": int(sum_escapes)},
    )
    fused = next(n for n in after.nodes if n.op == op)
    assert len(fused.outputs) == 2 and after.outputs == graph.outputs
    if kind == "ln":
        assert fused.attr("eps") == 1e-4


def test_add_norm_needs_a_residual_add() -> None:
    def bias(g: GraphBuilder) -> Tensor:
        s = g.add(g.input("a", (3, N)), g.const(np.ones(N)))
        return g.layer_norm(s, g.const(np.ones(N)), g.const(np.zeros(N)))

    check_unchanged(build(bias), "AddLayerNormFusionPass")

    def broadcast(g: GraphBuilder) -> Tensor:
        return g.rms_norm(g.add(g.input("a", (3, N)), g.input("b", (1, N))), g.input("gamma", (N,)))

    check_unchanged(build(broadcast), "AddRmsNormFusionPass")


def test_add_norm_refuses_a_fusion_that_would_be_a_cycle() -> None:
    def gamma_from_sum(g: GraphBuilder) -> Tensor:
        s = g.add(g.input("a", (3, N)), g.input("b", (3, N)))
        gamma = g.reduce_mean(s, 0, keepdims=False)  # (N,), computed from the sum itself
        return g.layer_norm(s, gamma, g.const(np.zeros(N)))

    check_unchanged(build(gamma_from_sum), "AddLayerNormFusionPass")


def test_add_norm_refuses_the_second_of_two_fusions_that_close_a_cycle() -> None:
    def crossed(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        s1 = g.add(g.input("a1", (3, N)), g.input("b1", (3, N)))
        s2 = g.add(g.input("a2", (3, N)), g.input("b2", (3, N)))
        beta = g.const(np.zeros(N))
        # Each norm's gamma comes from the other's sum: either fusion alone is fine, not both.
        y1 = g.layer_norm(s1, g.reduce_mean(s2, 0, keepdims=False), beta)
        y2 = g.layer_norm(s2, g.reduce_mean(s1, 0, keepdims=False), beta)
        return y1, y2

    check_fused(build(crossed), "AddLayerNormFusionPass", "AddLayerNorm", {"AddLayerNorm": 1})


def test_add_layer_norm_fuses_the_embedding_sum() -> None:
    """BERT: word + token type (constants after import folding, (B, S, N)) + position (1, S, N)."""
    rng = np.random.default_rng(8)

    def net(g: GraphBuilder) -> Tensor:
        words = g.reshape(g.input("words", (2 * 5, N)), (2, 5, N))
        s = g.add(
            g.add(words, g.const(rng.standard_normal((2, 5, N)))),
            g.const(rng.standard_normal((1, 5, N))),
        )
        return g.layer_norm(s, g.const(np.ones(N)), g.const(np.zeros(N)), eps=1e-12)

    graph = build(net)
    after = check_fused(
        graph, "AddLayerNormFusionPass", "AddLayerNorm", {"AddLayerNorm": 1, "Add": 1}
    )
    fused = next(n for n in after.nodes if n.op == "AddLayerNorm")
    assert after.values[fused.inputs[1]].shape == (1, 5, N)


def test_add_rms_norm_answers_to_its_mindspore_cast_alias() -> None:
    assert lookup("add_cast_rms_norm_cast_fusion") is BY_NAME["AddRmsNormFusionPass"]


def test_add_norm_deny_keeps_the_graph() -> None:
    check_denied(build(lambda g: _residual_norm(g, "ln", True)), "AddLayerNormFusionPass")


# ---- SwiGluFusionPass ---------------------------------------------------------------------------
SWIGLU_FORMS: dict[str, tuple[str, Callable[[GraphBuilder, Tensor, Tensor], Tensor]]] = {
    "silu": ("SwiGlu", lambda g, gate, up: g.mul(g.silu(gate), up)),
    "silu_right": ("SwiGlu", lambda g, gate, up: g.mul(up, g.silu(gate))),
    "sigmoid": ("SwiGluSigmoid", lambda g, gate, up: g.mul(g.silu_decomposed(gate), up)),
    "sigmoid_swapped": (
        "SwiGluSigmoid",
        lambda g, gate, up: g.mul(up, g.mul(g.sigmoid(gate), gate)),
    ),
}


@pytest.mark.parametrize("form", sorted(SWIGLU_FORMS))
def test_swiglu_fuses_every_form(form: str) -> None:
    pattern, fn = SWIGLU_FORMS[form]
    graph = build(lambda g: fn(g, g.input("gate", (3, 8)), g.input("up", (3, 8))))
    after = check_fused(
        graph, "SwiGluFusionPass", pattern, {"SwiGlu": 1, "Mul": 0, "Silu": 0, "Sigmoid": 0}
    )
    assert after.nodes[0].inputs == ("gate", "up")


def test_swiglu_needs_an_exclusive_gate() -> None:
    def silu_escapes(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        s = g.silu(g.input("gate", (3, 8)))
        return g.mul(s, g.input("up", (3, 8))), s

    check_unchanged(build(silu_escapes), "SwiGluFusionPass")

    def squared(g: GraphBuilder) -> Tensor:
        s = g.silu(g.input("gate", (3, 8)))
        return g.mul(s, s)  # "up" would be the Silu itself

    check_unchanged(build(squared), "SwiGluFusionPass")


def test_swiglu_deny_keeps_the_graph() -> None:
    check_denied(
        build(lambda g: g.mul(g.silu(g.input("gate", (3, 8))), g.input("up", (3, 8)))),
        "SwiGluFusionPass",
    )


# ---- SplitConcatFusionPass ----------------------------------------------------------------------
def test_split_concat_of_all_pieces_is_the_input() -> None:
    def net(g: GraphBuilder) -> Tensor:
        parts = g.split(g.relu(g.input("x", (4, 9))), (2, 3, 4), axis=1)
        return g.exp(g.concat(parts, axis=-1))

    after = check_fused(
        build(net), "SplitConcatFusionPass", "SplitConcat", {"Split": 0, "Concat": 0, "Slice": 0}
    )
    assert [n.op for n in after.nodes] == ["Relu", "Exp"]


def test_split_concat_keeps_output_names() -> None:
    def net(g: GraphBuilder) -> Tensor:
        return g.concat(g.split(g.relu(g.input("x", (6, 2))), (1, 5), axis=0), axis=0)

    graph = build(net)
    after = check_fused(graph, "SplitConcatFusionPass", "SplitConcat", {"Split": 0, "Concat": 0})
    assert after.outputs == graph.outputs and [n.op for n in after.nodes] == ["Relu"]
    check_unchanged(
        build(lambda g: g.concat(g.split(g.input("x", (6, 2)), (1, 5), axis=0), axis=0)),
        "SplitConcatFusionPass",
    )


def test_split_concat_of_a_run_is_one_slice() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        p = g.split(g.input("x", (4, 9)), (2, 3, 4), axis=1)
        return g.concat(p[1:], axis=1), g.exp(p[0])

    graph = build(net)
    after = check_fused(
        graph, "SplitConcatFusionPass", "SplitConcatSlice", {"Split": 1, "Concat": 0, "Slice": 1}
    )
    sl = next(n for n in after.nodes if n.op == "Slice")
    assert (sl.attr("starts"), sl.attr("ends"), sl.attr("axes")) == ((2,), (9,), (1,))


def test_split_concat_with_shared_pieces_keeps_the_split() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        p = g.split(g.relu(g.input("x", (4, 9))), (2, 3, 4), axis=1)
        return g.concat(p, axis=1), g.exp(p[2])

    check_fused(
        build(net), "SplitConcatFusionPass", "SplitConcat", {"Split": 1, "Concat": 0, "Exp": 1}
    )


def test_split_concat_needs_order_and_axis() -> None:
    def swapped(g: GraphBuilder) -> Tensor:
        p = g.split(g.input("x", (4, 9)), (2, 3, 4), axis=1)
        return g.concat((p[1], p[0], p[2]), axis=1)

    check_unchanged(build(swapped), "SplitConcatFusionPass")

    def other_axis(g: GraphBuilder) -> Tensor:
        p = g.split(g.input("x", (4, 4)), (2, 2), axis=1)
        return g.concat(p, axis=0)

    check_unchanged(build(other_axis), "SplitConcatFusionPass")


def test_split_concat_deny_keeps_the_graph() -> None:
    check_denied(
        build(lambda g: g.exp(g.concat(g.split(g.input("x", (4, 9)), (4, 5), axis=1), axis=1))),
        "SplitConcatFusionPass",
    )


# ---- all GraphFusion passes on a transformer-like block -----------------------------------------
def _transformer_block(g: GraphBuilder) -> Tensor:
    rng = np.random.default_rng(7)
    t, d, h = 4, 8, 16

    def c(arr: np.ndarray) -> Tensor:
        return g.const(np.asarray(arr, dtype=g.dtype))

    def w(*shape: int) -> Tensor:
        return c(rng.standard_normal(shape) / np.sqrt(shape[0]))

    x = g.input("x", (t, d))
    q, k, v = (g.matmul(x, w(d, d)) for _ in range(3))
    scores = g.mul(g.matmul(q, g.transpose(k, (1, 0))), 1.0 / np.sqrt(d))
    attn = g.matmul(g.softmax_decomposed(scores), v)
    h1 = g.layer_norm_decomposed(g.add(x, attn), c(np.ones(d)), c(np.zeros(d)))
    up = g.gelu_decomposed(g.add(g.matmul(h1, w(d, h)), c(rng.standard_normal(h))))
    down = g.add(g.matmul(up, w(h, d)), c(rng.standard_normal(d)))
    return g.layer_norm_decomposed(g.add(h1, down), c(np.full(d, 0.5)), c(np.full(d, 0.1)))


def fuse_all_counts() -> dict[str, int]:
    """The block after every GraphFusion pass: q, k, v, up and down MatMuls (two with their
    bias), one Attention (scores MatMul, scale, softmax and context MatMul; the Transpose of k is
    absorbed), two residual norms, one GELU."""
    return {"MatMul": 5, "Attention": 1, "AddLayerNorm": 2, "Gelu": 1}


def test_all_graph_passes_fuse_a_transformer_block() -> None:
    graph = build(_transformer_block, "block")
    result = run_pipeline(graph, FusionConfig.resolve(all_switch={"UBFusion": False}))
    after = result.fused.graph
    assert after.op_counts() == fuse_all_counts()
    assert_same_outputs(graph, after)
    report = result.report
    assert report.effected("MatMulBiasAddFusionPass") == 2
    assert line("LayerNormFusionPass", "LayerNormMulSqrt", 2, 2) in report.log_lines()
    assert line("AddLayerNormFusionPass", "AddLayerNorm", 2, 2) in report.log_lines()
    assert [s.pass_name for s in report.stats][:2] == [
        "ConstantFoldingPass",
        "IdentityEliminationPass",
    ]
    # Every original node is named by exactly the fused nodes that stand for it.
    origins = [o for n in after.nodes for o in n.origin]
    assert sorted(origins) == sorted(n.name for n in graph.nodes)
    assert BY_NAME["GeluFusionPass"].exact


def test_all_graph_passes_fuse_a_float32_block_within_rounding() -> None:
    g = GraphBuilder("block32")
    g.output(_transformer_block(g))
    graph = g.build()
    after = run_pipeline(graph, FusionConfig.resolve(all_switch={"UBFusion": False})).fused.graph
    assert after.op_counts() == fuse_all_counts()
    assert {v.dtype for v in after.values.values()} == {"float32"}
    assert_same_outputs(graph, after, rtol=1e-6)


# ---- property: random compositions of the patterns, some intermediates escaping -----------------
R, C = 3, 4


def _block(g: GraphBuilder, h: Tensor, kind: str, v: int) -> Tensor:
    """One pattern instance on ``h`` (shape (R, C)); ``v`` picks the variant."""
    rng = np.random.default_rng(v)
    if kind == "softmax":
        return _softmax(g, h, (-1, 0)[v % 2])
    if kind == "layer_norm":
        gamma, beta = g.const(rng.uniform(0.5, 1.5, C)), g.const(rng.standard_normal(C))
        square, root = ("Pow", "Mul")[v % 2], ("Sqrt", "Rsqrt")[v // 2 % 2]
        return _layer_norm_variant(
            g, h, square, root, gamma if v % 3 else None, beta if v % 5 else None
        )
    if kind == "rms_norm":
        x = g.add(g.relu(h), 0.5)
        gamma = g.input(f"gamma{len(g.inputs)}", (C,)) if v % 3 else None
        return _rms_variant(g, x, ("Pow", "Mul")[v % 2], ("Sqrt", "Rsqrt")[v // 2 % 2], gamma)
    if kind == "gelu":
        return GELU_FORMS[sorted(GELU_FORMS)[v % len(GELU_FORMS)]][1](g, h)
    if kind == "gelu_tanh":
        return GELU_TANH_FORMS[sorted(GELU_TANH_FORMS)[v % len(GELU_TANH_FORMS)]](g, h)
    if kind == "geglu":
        return g.mul(g.input(f"up{len(g.inputs)}", (R, C)), g.gelu(h, ("none", "tanh")[v % 2]))
    if kind == "swiglu":
        up = g.input(f"up{len(g.inputs)}", (R, C))
        return SWIGLU_FORMS[sorted(SWIGLU_FORMS)[v % len(SWIGLU_FORMS)]][1](g, h, up)
    if kind == "residual_norm":
        s = g.add(h, g.input(f"r{len(g.inputs)}", (R, C)))
        gamma = g.const(rng.uniform(0.5, 1.5, C))
        return g.layer_norm(s, gamma, g.const(np.zeros(C))) if v % 2 else g.rms_norm(s, gamma)
    if kind == "linear":
        y = g.matmul(h, g.const(rng.standard_normal((C, C)) / 2))
        return (
            g.bias_add(y, g.const(rng.standard_normal(C)))
            if v % 2
            else g.add(y, g.const(rng.standard_normal(C)))
        )
    if kind == "split_concat":
        p = g.split(h, (1, 1, 2), axis=1)
        return (
            g.concat(p, axis=1)
            if v % 2
            else g.concat((g.concat(p[:2], axis=1), g.exp(p[2])), axis=1)
        )
    return g.div(g.sub(g.mul(g.reshape(h, (R, C)), 1.0), 0.0), 1.0)  # identities


BLOCKS = (
    "softmax",
    "layer_norm",
    "rms_norm",
    "gelu",
    "gelu_tanh",
    "geglu",
    "swiglu",
    "residual_norm",
    "linear",
    "split_concat",
    "identity",
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blocks=st.lists(st.tuples(st.sampled_from(BLOCKS), st.integers(0, 29)), min_size=1, max_size=4),
    escapes=st.lists(st.integers(0, 10_000), max_size=3),
)
def test_graph_passes_preserve_the_interpreter_result(
    blocks: list[tuple[str, int]], escapes: list[int]
) -> None:
    g = GraphBuilder("random", dtype=F64)
    h = g.input("x", (R, C))
    for kind, variant in blocks:
        h = _block(g, h, kind, variant)
    g.output(h)
    produced = [o for n in g.nodes for o in n.outputs]
    g.output(*(Tensor(g, produced[i % len(produced)]) for i in escapes))
    graph = g.build()
    result = run_pipeline(graph, FusionConfig.resolve(all_switch={"UBFusion": False}))
    after = result.fused.graph
    assert after.outputs == graph.outputs
    assert len(after.nodes) <= len(graph.nodes)
    assert_same_outputs(graph, after, rtol=1e-7)
    for app in result.report.applications:
        assert set(app.nodes) <= {n.name for n in graph.nodes}
