"""Fused kernels against the interpreter: loop nests with reductions, normalizations, contractions.

Where test_op_rules.py checks one op per kernel, this file checks what fusion makes of several:
a reduction with its elementwise prologue and epilogue in one loop nest, the normalizations
that codegen lowers through their expansions (ir/expand.py), MatMul with fused epilogues under
every row block, and the groups :func:`check_fusable` must refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from fusiontune.codegen import check_fusable, group_sources, kernel_source
from fusiontune.ir import Graph, GraphBuilder, Tensor, random_inputs, run_graph
from fusiontune.ir.expand import EXPANDABLE, expand
from fusiontune.ir.ops import run_reference
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program

F32 = dict(rtol=1e-5, atol=1e-5)  # a fused float32 kernel vs the float32 interpreter
F64 = dict(rtol=1e-4, atol=1e-5)  # ... vs the float64 interpreter


def build(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], name: str = "g") -> Graph:
    g = GraphBuilder(name)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def one_group(graph: Graph, schedule: Mapping[str, int] | None = None) -> FusedGraph:
    """All nodes of ``graph`` in one group (one kernel)."""
    group = Group("all", tuple(n.name for n in graph.nodes), schedule=dict(schedule or {}))
    return FusedGraph.singletons(graph).with_groups([group])


def run_fused(fused: FusedGraph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    prog = build_program(fused)
    return {k: np.array(v, copy=True) for k, v in prog.run(inputs).items()}


def assert_matches_interpreter(
    graph: Graph, got: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]
) -> None:
    own = run_graph(graph, inputs, dtype=None)
    ideal = run_graph(graph, inputs, dtype="float64")
    assert list(got) == list(graph.outputs)
    for name in graph.outputs:
        assert got[name].dtype == own[name].dtype, name
        np.testing.assert_allclose(got[name], own[name], err_msg=name, **F32)
        np.testing.assert_allclose(got[name], ideal[name], err_msg=name, **F64)


def _const(
    g: GraphBuilder, shape: tuple[int, ...], seed: int, scale: float = 1.0, offset: float = 0.0
) -> Tensor:
    rng = np.random.default_rng(seed)
    return g.const((rng.standard_normal(shape) * scale + offset).astype(np.float32))


# ---- loop nests: reductions with prologue and epilogue -------------------------------------------
def _prologue_sum_epilogue(g: GraphBuilder) -> Tensor:
    x, y = g.input("x", (6, 20)), g.input("y", (6, 20))
    p = g.exp(g.mul(g.sub(x, y), 0.5))  # prologue: elementwise over the domain
    s = g.reduce_sum(p)  # (6, 1)
    return g.tanh(g.div(p, s))  # epilogue: reads the row value and the prologue again


def _two_rounds_variance(g: GraphBuilder) -> tuple[Tensor, Tensor]:
    x = g.input("x", (5, 33))
    mean = g.reduce_mean(g.add(x, 1.0))
    d = g.sub(g.add(x, 1.0), mean)
    var = g.reduce_mean(g.mul(d, d))  # depth 2: reads a value computed from the first reduction
    return g.mul(d, g.rsqrt(g.add(var, 1e-5))), var


def _reduce_axis0(g: GraphBuilder) -> Tensor:
    x = g.input("x", (7, 4, 3))
    m = g.reduce_max(g.mul(x, x), axes=0)
    return g.sub(g.mul(x, x), m)


def _reduce_middle_axes_drop(g: GraphBuilder) -> Tensor:
    x = g.input("x", (3, 4, 5, 2))
    return g.reduce_sum(g.sigmoid(x), axes=(1, 2), keepdims=False)


def _residual_row_scale(g: GraphBuilder) -> tuple[Tensor, Tensor]:
    x, r = g.input("x", (4, 16)), g.input("r", (4, 16))
    s = g.add(x, r)  # exported: a second output of the same kernel
    m = g.reduce_max(s)
    return s, g.mul(g.relu(g.sub(s, m)), _const(g, (16,), 3))


def _scalar_epilogue(g: GraphBuilder) -> Tensor:
    x = g.input("x", (8, 12))
    return g.sqrt(g.add(g.reduce_mean(g.mul(x, x)), 1.0))  # (8, 1) epilogue on the row value only


LOOP_GROUPS = {
    "prologue_sum_epilogue": _prologue_sum_epilogue,
    "two_rounds_variance": _two_rounds_variance,
    "reduce_axis0": _reduce_axis0,
    "reduce_middle_axes_drop": _reduce_middle_axes_drop,
    "residual_row_scale": _residual_row_scale,
    "scalar_epilogue": _scalar_epilogue,
}


@pytest.mark.parametrize("name", list(LOOP_GROUPS))
def test_reduction_with_prologue_and_epilogue_is_one_kernel_matching_interpreter(name: str) -> None:
    graph = build(LOOP_GROUPS[name], name)
    fused = one_group(graph)
    assert check_fusable(graph, fused.groups[0].nodes) is None
    assert kernel_source(graph, fused.groups[0].nodes).kind == "loop"
    inputs = random_inputs(graph, seed=3)
    assert_matches_interpreter(graph, run_fused(fused, inputs), inputs)


def test_elementwise_dag_with_broadcasts_is_one_flat_kernel() -> None:
    def fn(g: GraphBuilder) -> Tensor:
        x, col, row = g.input("x", (2, 3, 8)), g.input("col", (3, 1)), g.input("row", (8,))
        c = g.where(g.greater(x, col), g.mul(x, row), g.neg(x))
        return g.add(g.cast(g.less(c, 0.0), "float32"), g.gelu(c))

    graph = build(fn)
    inputs = random_inputs(graph, seed=4)
    assert_matches_interpreter(graph, run_fused(one_group(graph), inputs), inputs)


# ---- normalizations: one node, lowered through its expansion ------------------------------------
def _norm_graph(op: str, dtype: str = "float32") -> Graph:
    g = GraphBuilder(f"norm_{op}", dtype=dtype)
    rng = np.random.default_rng(7)
    x = g.input("x", (3, 4, 24))
    gamma = g.const(rng.uniform(0.5, 1.5, 24).astype(dtype))
    beta = g.const(rng.standard_normal(24).astype(dtype))
    if op == "Softmax":
        out = g.softmax(x)
    elif op == "LogSoftmax":
        out = g.op("LogSoftmax", x)
    elif op == "LayerNorm":
        out = g.layer_norm(x, gamma, beta)
    elif op == "RMSNorm":
        out = g.rms_norm(x, gamma)
    elif op == "AddLayerNorm":
        out = g.op(op, x, g.input("r", (3, 4, 24)), gamma, beta, n_outputs=2)
    elif op == "AddRmsNorm":
        out = g.op(op, x, g.input("r", (4, 24)), gamma, n_outputs=2)
    elif op == "SoftmaxGrad":  # the backward ops (ir/_ops_grad.py): x stands for y or the input
        out = g.op(op, x, g.input("dy", (3, 4, 24)))
    else:  # LayerNormGrad, RmsNormGrad, recomputing their statistics
        out = g.op(op, x, gamma, g.input("dy", (3, 4, 24)), n_outputs=2)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def test_every_expandable_op_has_a_normalization_case() -> None:
    assert set(EXPANDABLE) == {
        "Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "AddLayerNorm", "AddRmsNorm",
        "SoftmaxGrad", "LayerNormGrad", "RmsNormGrad",
    }


@pytest.mark.parametrize("op", EXPANDABLE)
def test_normalization_kernel_matches_reference(op: str) -> None:
    graph = _norm_graph(op)
    prog = build_program(FusedGraph.singletons(graph))
    assert prog.kernel_count == 1
    assert prog.kernels[0].kind == "loop"
    inputs = random_inputs(graph, seed=5)
    got = {k: np.array(v, copy=True) for k, v in prog.run(inputs).items()}
    assert_matches_interpreter(graph, got, inputs)


@pytest.mark.parametrize("op", ["Softmax", "LayerNorm", "RMSNorm"])
def test_normalization_kernel_divides_once_per_row(op: str) -> None:
    # Softmax's 1/sum and the norms' 1/sqrt are per-row values; reassoc must not sink their
    # division into the inner loop (v * (1/s) -> v / s): no vector fdiv in the kernel.
    import re

    g = GraphBuilder(f"rows_{op}")
    x = g.input("x", (8, 256))
    gamma = g.const(np.linspace(0.5, 1.5, 256, dtype=np.float32))
    beta = g.const(np.linspace(-1.0, 1.0, 256, dtype=np.float32))
    out = {"Softmax": lambda: g.softmax(x), "LayerNorm": lambda: g.layer_norm(x, gamma, beta),
           "RMSNorm": lambda: g.rms_norm(x, gamma)}[op]()
    g.output(out)
    (src,) = [s for _, s in group_sources(FusedGraph.singletons(g.build()))]
    namespace: dict[str, object] = {}
    exec(src.source.replace("cache=True", "cache=False"), namespace)  # a fresh compile: its IR
    llvm = "\n".join(namespace[src.name].inspect_llvm().values())  # type: ignore[attr-defined]
    assert re.search(r"fmul[^\n]*<\d+ x float>", llvm), "the inner loop did not vectorize"
    assert not re.search(r"fdiv[^\n]*<\d+ x float>", llvm)


def _expanded_graph(graph: Graph) -> Graph:
    """``graph``'s single node replaced by its expansion."""
    (node,) = graph.nodes
    e = expand(node, graph.values)
    return Graph(
        f"{graph.name}_expanded",
        {**graph.values, **e.values},
        e.nodes,
        graph.inputs,
        graph.outputs,
        {**graph.constants, **e.constants},
    )


@pytest.mark.parametrize("op", EXPANDABLE)
def test_expansion_equals_reference_in_float64(op: str) -> None:
    graph = _norm_graph(op, dtype="float64")
    expanded = _expanded_graph(graph)
    expanded.validate()
    assert all(n.op not in EXPANDABLE for n in expanded.nodes)
    inputs = random_inputs(graph, seed=6)
    want = run_graph(graph, inputs)
    got = run_graph(expanded, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("op", EXPANDABLE)
def test_expansion_apply_part_reads_only_op_inputs_and_statistics(op: str) -> None:
    """Cutting between ``stats`` and ``apply`` is valid: apply needs nothing else from stats' work."""
    graph = _norm_graph(op)
    (node,) = graph.nodes
    e = expand(node, graph.values)
    assert e.stats and e.apply
    stats_out = {o for n in e.stats for o in n.outputs}
    apply_out = {o for n in e.apply for o in n.outputs}
    allowed = set(node.inputs) | stats_out | apply_out | set(e.constants)
    for n in e.apply:
        assert set(n.inputs) <= allowed, n
    assert set(node.outputs) <= stats_out | apply_out
    assert not any(n.op.startswith("Reduce") for n in e.apply)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_expansion_on_any_axis_equals_reference(axis: int) -> None:
    g = GraphBuilder("softmax_axis", dtype="float64")
    g.output(g.softmax(g.input("x", (3, 5, 4)), axis=axis))
    graph = g.build()
    inputs = random_inputs(graph, seed=8)
    np.testing.assert_allclose(
        run_graph(_expanded_graph(graph), inputs)[graph.outputs[0]],
        run_reference(graph.nodes[0], [inputs["x"]])[0],
        rtol=1e-12,
        atol=1e-14,
    )


# ---- contractions with epilogues, under every row block ------------------------------------------
def _mm_bias_vector(g: GraphBuilder) -> Tensor:
    return g.add(
        g.matmul(g.input("a", (37, 16)), _const(g, (16, 24), 1, 0.25)), _const(g, (24,), 2)
    )


def _mm_bias_input_residual(g: GraphBuilder) -> Tensor:
    a, r = g.input("a", (2, 19, 16)), g.input("r", (2, 19, 24))
    return g.add(g.matmul(a, _const(g, (16, 24), 1, 0.25), _const(g, (24,), 2)), r)


def _mm_gelu(g: GraphBuilder) -> Tensor:
    return g.gelu(g.matmul(g.input("a", (70, 8)), g.input("b", (8, 12))))


def _mm_bias_gelu_scale_two_outputs(g: GraphBuilder) -> tuple[Tensor, Tensor]:
    y = g.matmul(g.input("a", (2, 3, 9, 8)), g.input("b", (2, 3, 8, 5)))
    return y, g.mul(g.gelu(g.add(y, _const(g, (5,), 3))), 0.5)


def _mm_batched_relu_residual(g: GraphBuilder) -> Tensor:
    a, b, r = g.input("a", (3, 10, 6)), g.input("b", (3, 6, 7)), g.input("r", (3, 10, 7))
    return g.relu(g.add(g.matmul(a, b), r))


CONTRACTIONS = {
    "bias_vector": _mm_bias_vector,
    "bias_input_residual": _mm_bias_input_residual,
    "gelu": _mm_gelu,
    "bias_gelu_scale_two_outputs": _mm_bias_gelu_scale_two_outputs,
    "batched_relu_residual": _mm_batched_relu_residual,
}
ROW_BLOCKS = (0, 1, 7, 64)


@pytest.mark.parametrize("name", list(CONTRACTIONS))
def test_contraction_with_epilogue_matches_interpreter_for_every_row_block(name: str) -> None:
    graph = build(CONTRACTIONS[name], name)
    inputs = random_inputs(graph, seed=9)
    results = {}
    for rb in ROW_BLOCKS:
        fused = one_group(graph, {"row_block": rb})
        assert kernel_source(graph, fused.groups[0].nodes, {"row_block": rb}).kind == "contraction"
        results[rb] = run_fused(fused, inputs)
        assert_matches_interpreter(graph, results[rb], inputs)
    for rb in ROW_BLOCKS[1:]:
        for out in graph.outputs:
            # Each output element is the same dot product whatever the block, but BLAS may sum it
            # in another order for another row count (OpenBLAS 0.3.30 on an AMD EPYC does, on an
            # Intel Xeon it did not): equal to float32 rounding, not bit for bit.
            np.testing.assert_allclose(
                results[rb][out], results[0][out], rtol=1e-5, atol=1e-6, err_msg=f"row_block={rb} {out}"
            )


@pytest.mark.parametrize("name", list(CONTRACTIONS))
@pytest.mark.parametrize("rb", ROW_BLOCKS[1:])
def test_row_block_changes_the_generated_source(name: str, rb: int) -> None:
    graph = build(CONTRACTIONS[name], name)
    nodes = [n.name for n in graph.nodes]
    plain = kernel_source(graph, nodes, {"row_block": 0})
    split = kernel_source(graph, nodes, {"row_block": rb})
    assert split.source != plain.source
    assert split.key != plain.key


def test_distinct_row_blocks_give_distinct_kernels() -> None:
    graph = build(_mm_bias_vector)
    nodes = [n.name for n in graph.nodes]
    keys = {kernel_source(graph, nodes, {"row_block": rb}).key for rb in (0, 1, 7, 64)}
    assert len(keys) == 4


# ---- check_fusable: groups no template can run -----------------------------------------------------
def _refusals() -> dict[str, Graph]:
    def two_axes(g: GraphBuilder) -> Tensor:
        x = g.input("x", (4, 6))
        return g.add(g.reduce_sum(x, axes=-1), g.reduce_sum(g.reduce_max(x, axes=0), axes=-1))

    def two_axes_same_input(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        x = g.input("x", (4, 6))
        return g.reduce_sum(x, axes=-1), g.reduce_max(x, axes=0)

    def mm_reduction(g: GraphBuilder) -> Tensor:
        return g.reduce_sum(g.matmul(g.input("a", (4, 5)), g.input("b", (5, 6))))

    def mm_softmax(g: GraphBuilder) -> Tensor:
        return g.softmax(g.matmul(g.input("a", (4, 5)), g.input("b", (5, 6))))

    def two_matmuls(g: GraphBuilder) -> Tensor:
        a = g.input("a", (4, 5))
        return g.matmul(g.matmul(a, g.input("b", (5, 5))), g.input("c", (5, 3)))

    def transpose_then_add(g: GraphBuilder) -> Tensor:
        return g.add(g.transpose(g.input("x", (4, 6)), (1, 0)), 1.0)

    def add_then_reshape(g: GraphBuilder) -> Tensor:
        return g.reshape(g.add(g.input("x", (4, 6)), 1.0), (24,))

    def concat_with_producer(g: GraphBuilder) -> Tensor:
        x = g.input("x", (4, 6))
        return g.concat([g.exp(x), x], axis=0)

    def slice_then_mul(g: GraphBuilder) -> Tensor:
        return g.mul(g.slice(g.input("x", (4, 6)), (1,), (3,), (0,)), 2.0)

    def kept_reduction_feeds_drop(g: GraphBuilder) -> Tensor:
        x = g.input("x", (4, 6))
        return g.exp(g.reduce_sum(x, axes=-1, keepdims=False))

    return {
        "two_reductions_different_axes": build(two_axes),
        "sibling_reductions_different_axes": build(two_axes_same_input),
        "matmul_reduction_epilogue": build(mm_reduction),
        "matmul_softmax_epilogue": build(mm_softmax),
        "two_matmuls": build(two_matmuls),
        "transpose_with_add": build(transpose_then_add),
        "add_with_reshape": build(add_then_reshape),
        "concat_with_producer": build(concat_with_producer),
        "slice_with_mul": build(slice_then_mul),
        "keepdims_false_reduction_with_consumer": build(kept_reduction_feeds_drop),
    }


REFUSALS = _refusals()


@pytest.mark.parametrize("name", list(REFUSALS))
def test_check_fusable_refuses_groups_no_template_runs(name: str) -> None:
    graph = REFUSALS[name]
    reason = check_fusable(graph, [n.name for n in graph.nodes])
    assert isinstance(reason, str) and reason


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_group_still_runs_as_singletons(name: str) -> None:
    graph = REFUSALS[name]
    inputs = random_inputs(graph, seed=10)
    assert_matches_interpreter(graph, run_fused(FusedGraph.singletons(graph), inputs), inputs)


@pytest.mark.parametrize("name", list(LOOP_GROUPS) + list(CONTRACTIONS))
def test_check_fusable_accepts_groups_that_compile(name: str) -> None:
    graph = build({**LOOP_GROUPS, **CONTRACTIONS}[name], name)
    assert check_fusable(graph, [n.name for n in graph.nodes]) is None


# ---- an epilogue that reads an operand of the MatMul -----------------------------------------------
def _mm_plus_lhs(g: GraphBuilder) -> Tensor:
    x = g.input("x", (4, 8))
    return g.add(
        g.matmul(x, _const(g, (8, 8), 11, 0.3)), x
    )  # y = x @ W + x: a residual around a Linear


def _mm_plus_rhs(g: GraphBuilder) -> Tensor:
    w = g.input("w", (8, 8))
    return g.mul(g.matmul(g.input("x", (8, 8)), w), w)


@pytest.mark.parametrize("name", ["plus_lhs", "times_rhs"])
def test_epilogue_may_read_the_matmul_operands(name: str) -> None:
    graph = build({"plus_lhs": _mm_plus_lhs, "times_rhs": _mm_plus_rhs}[name], name)
    inputs = random_inputs(graph, seed=12)
    assert_matches_interpreter(graph, run_fused(one_group(graph), inputs), inputs)


def test_no_kernel_is_compiled_parallel_where_numba_runs_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parallel region costs a threading-layer entry even with one thread: with
    ``NUMBA_NUM_THREADS=1`` the kernel that runs in parallel elsewhere is compiled serial, and
    computes the same values."""
    import numba

    b = GraphBuilder("one_thread")
    x = b.input("x", (256, 512))
    b.output(b.relu(b.add(x, x)))
    graph = b.build()
    names = tuple(n.name for n in graph.nodes)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    assert "parallel=True" in kernel_source(graph, list(names)).source
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    assert "parallel=False" in kernel_source(graph, list(names)).source
    prog = build_program(FusedGraph(graph, (Group("all", names, (), {}),)))
    inputs = random_inputs(graph, seed=0)
    out = graph.outputs[0]
    np.testing.assert_allclose(prog.run(inputs)[out], run_graph(graph, inputs)[out], rtol=1e-6)


def _one_task_graphs(batch: int) -> dict[str, Graph]:
    """Kernels above the parallel threshold whose parallel loop runs over ``batch`` iterations."""
    graphs = {}
    b = GraphBuilder("concat")
    b.output(b.concat([b.input("x", (batch, 32, 32, 32)), b.input("y", (batch, 32, 32, 32))], axis=1))
    graphs["Concat"] = b.build()
    b = GraphBuilder("transpose")
    b.output(b.transpose(b.input("x", (batch, 64, 32, 32)), (0, 2, 3, 1)))
    graphs["Transpose"] = b.build()
    b = GraphBuilder("gather")  # 512 rows of each batch's table (at batch 1, an embedding lookup)
    rows = b.const(np.arange(512, dtype=np.int64)[::-1] % 100)
    b.output(b.op("Gather", b.input("table", (batch, 100, 64)), rows, axis=1))
    graphs["Gather"] = b.build()
    b = GraphBuilder("gemv")  # the BLAS path cuts rows into one chunk per thread
    b.output(b.relu(b.matmul(b.input("x", (batch, 512)), b.input("w", (512, 512)))))
    graphs["MatMul"] = b.build()
    return graphs


@pytest.mark.parametrize("op", ["Concat", "Transpose", "Gather", "MatMul"])
def test_a_parallel_loop_of_one_iteration_is_compiled_serial(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At batch 1 these kernels' parallel loops (over the batch, the indices before a Gather's
    axis, the row chunks of a GEMV) have one iteration: they compile serial, and at batch 2
    parallel. A parallel region of one task only adds its entry to every call, and numba about
    3.4 times the compile time."""
    import numba

    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    schedule = {"matmul_algo": "blas"} if op == "MatMul" else {}
    for batch, flag in ((1, "parallel=False"), (2, "parallel=True")):
        graph = _one_task_graphs(batch)[op]
        names = [n.name for n in graph.nodes]
        assert flag in kernel_source(graph, names, schedule).source, (batch, flag)
    graph = _one_task_graphs(1)[op]
    inputs = random_inputs(graph, seed=3)
    assert_matches_interpreter(graph, run_fused(one_group(graph), inputs), inputs)
