"""Fusion of a training step's backward: transposed MatMul operands, gradient reductions with
their optimizer update in one multi-output kernel, updates in place; each against the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.config import FusionConfig
from fusiontune.ir import Graph, GraphBuilder, random_inputs, run_graph
from fusiontune.ir.training import TrainSpec
from fusiontune.measure import MeasureConfig
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.graph.transpose_matmul import transpose_matmul_fusion
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.passes.registry import BY_NAME
from fusiontune.runtime import build_program
from fusiontune.tune.evaluate import build_candidate, check_and_time
from fusiontune.workloads import make_workload
from fusiontune.workloads.workload import training_workload

_QUICK = MeasureConfig(warmup=0, number=1, repeat=1, min_repeat_ms=0.0)


def _ctx() -> PassContext:
    ctx = PassContext(config=FusionConfig.defaults(), deny={})
    ctx.begin(BY_NAME["TransposeMatMulFusionPass"])
    return ctx


def _matches_interpreter(graph: Graph, config: FusionConfig, rtol: float = 1e-4) -> FusedGraph:
    fused = run_pipeline(graph, config).fused
    inputs = random_inputs(graph)
    ref = run_graph(graph, inputs, "float64")
    out = build_program(fused).run(inputs)
    for k in graph.outputs:
        np.testing.assert_allclose(out[k], ref[k], rtol=rtol, atol=rtol)
    return fused


def _backward_matmuls() -> Graph:
    """dX = dY @ W^T, dW = X^T @ dY (batched, as the VJP writes them)."""
    g = GraphBuilder("bwd")
    x, w, dy = g.input("x", (2, 8, 16)), g.input("w", (16, 12)), g.input("dy", (2, 8, 12))
    dx = g.matmul(dy, g.transpose(w, (1, 0)))
    dw = g.matmul(g.transpose(x, (0, 2, 1)), dy)
    g.output(g.relu(dx), dw)
    return g.build()


def test_transpose_matmul_folds_the_transposes_into_the_matmuls() -> None:
    graph = _backward_matmuls()
    rewritten = transpose_matmul_fusion(graph, _ctx())
    ops = [n.op for n in rewritten.nodes]
    assert "Transpose" not in ops
    flags = sorted((n.attrs.get("trans_a", 0), n.attrs.get("trans_b", 0)) for n in rewritten.nodes if n.op == "MatMul")
    assert flags == [(0, 1), (1, 0)]
    inputs = random_inputs(graph)
    before, after = run_graph(graph, inputs, "float64"), run_graph(rewritten, inputs, "float64")
    for k in graph.outputs:
        np.testing.assert_allclose(after[k], before[k], rtol=1e-12)


def test_transpose_matmul_removes_the_layout_kernels() -> None:
    graph = _backward_matmuls()
    on = _matches_interpreter(graph, FusionConfig.defaults())
    off = _matches_interpreter(graph, FusionConfig.resolve(explicit={"TransposeMatMulFusionPass": False}))
    assert off.kernel_count - on.kernel_count == 2


def test_a_transpose_with_another_reader_stays() -> None:
    g = GraphBuilder("shared")
    x, w = g.input("x", (8, 16)), g.input("w", (12, 16))
    wt = g.transpose(w, (1, 0))
    g.output(g.matmul(x, wt), g.relu(wt))
    rewritten = transpose_matmul_fusion(g.build(), _ctx())
    assert [n.op for n in rewritten.nodes].count("Transpose") == 1


def _layer_norm_grads() -> Graph:
    """bias, gamma and beta gradients of one layer, each with an SGD update, as the step writes them."""
    g = GraphBuilder("ln_grads")
    dy, xhat = g.input("dy", (2, 8, 16)), g.input("xhat", (2, 8, 16))
    outs = []
    for name, t in (("gamma", g.mul(g.mul(dy, 3.0), xhat)), ("beta", g.mul(dy, 3.0))):
        p = g.input(name, (16,))
        grad = g.reshape(g.reduce_sum(t, [0, 1], keepdims=True), (16,))
        outs += [grad, g.sub(p, g.mul(grad, 0.1))]
    g.output(*outs)
    return g.build()


def test_gradient_reductions_and_their_updates_become_one_kernel() -> None:
    graph = _layer_norm_grads()
    fused = _matches_interpreter(graph, FusionConfig.defaults())
    reductions = [grp for grp in fused.groups if any(fused.graph.node(n).op == "ReduceSum" for n in grp.nodes)]
    assert len(reductions) == 1
    ops = [fused.graph.node(n).op for n in reductions[0].nodes]
    assert ops.count("ReduceSum") == 2 and "Sub" in ops and "Reshape" not in ops
    off = run_pipeline(graph, FusionConfig.resolve(explicit={"TbeMultiOutputFusionPass": False})).fused
    assert off.kernel_count == fused.kernel_count + 1


@pytest.fixture(scope="module", params=["sgd", "adam"])
def step(request: pytest.FixtureRequest):
    w = training_workload(make_workload("transformer_block"), TrainSpec(optimizer=request.param))
    return w, build_candidate(w, FusionConfig.defaults())


def test_the_fused_step_holds_the_float32_floor(step) -> None:
    w, cand = step
    floor = w.errors(run_graph(w.reference_graph, w.inputs, dtype=None))
    checked = check_and_time(w, cand.program, _QUICK, timing=False)
    assert checked.errors.finite and checked.errors.max_rel <= max(10 * floor.max_rel, 1e-5)


def test_the_step_updates_every_weight_and_state_in_place(step) -> None:
    _, cand = step
    program = cand.program
    names = [o for o in program.graph.outputs if o.startswith("updated/")]
    assert names and set(program.in_place) == set(names)
    assert all(program.in_place[o] == o[len("updated/") :] for o in names)


def test_an_in_place_step_run_twice_gives_the_same_outputs_and_leaves_the_inputs(step) -> None:
    w, cand = step
    snapshot = {k: np.array(v) for k, v in w.inputs.items()}
    first = check_and_time(w, cand.program, _QUICK, timing=False).outputs
    second = check_and_time(w, cand.program, _QUICK, timing=False).outputs
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])
    for k in snapshot:
        np.testing.assert_array_equal(w.inputs[k], snapshot[k])


def test_the_step_has_no_transpose_feeding_a_matmul_and_no_lone_gradient_reduction(step) -> None:
    w, cand = step
    fused = cand.pipeline.fused
    g = fused.graph
    producer = {o: n for n in g.nodes for o in n.outputs}
    for node in g.nodes:
        if node.op == "MatMul":
            for v in node.inputs[:2]:
                p = producer.get(v)
                perm = p.attrs.get("perm") if p is not None and p.op == "Transpose" else None
                assert perm is None or tuple(perm[-2:]) != (len(perm) - 1, len(perm) - 2) or list(perm[:-2]) != list(range(len(perm) - 2))
    for grp in fused.groups:
        grads = {f"grad/{p}" for p in w.train.params}
        if any(g.node(n).op == "ReduceSum" and g.node(n).outputs[0] in grads for n in grp.nodes):
            assert any(o.startswith("updated/") for n in grp.nodes for o in g.node(n).outputs), grp.name


def _renamed(graph: Graph, names: dict[str, str]) -> Graph:
    """``graph`` with some values renamed (the builder names values after their nodes)."""
    from dataclasses import replace

    def r(v: str) -> str:
        return names.get(v, v)

    values = {r(k): replace(v, name=r(k)) for k, v in graph.values.items()}
    nodes = tuple(replace(n, inputs=tuple(map(r, n.inputs)), outputs=tuple(map(r, n.outputs))) for n in graph.nodes)
    return Graph(graph.name, values, nodes, graph.inputs, tuple(map(r, graph.outputs)), graph.constants)


def _weight_step() -> Graph:
    """dW = sum over the batch of X^T dY (as sum_to writes it), then SGD with momentum on W."""
    g = GraphBuilder("weight_step")
    x, dy = g.input("x", (2, 8, 16)), g.input("dy", (2, 8, 12))
    w, m = g.input("w", (16, 12)), g.input("m", (16, 12))
    partial = g.matmul(g.transpose(x, (0, 2, 1)), dy)
    grad = g.reshape(g.reduce_sum(partial, [0], keepdims=True), (16, 12))
    buf = g.add(g.mul(m, 0.9), grad)
    new_w = g.sub(w, g.mul(buf, 0.1))
    g.output(grad, buf, new_w)
    return _renamed(g.build(), {grad.name: "grad/w", buf.name: "updated/m", new_w.name: "updated/w"})


def test_a_weight_gradient_is_one_gemm_with_its_update_as_epilogue_in_place() -> None:
    graph = _weight_step()
    fused = _matches_interpreter(graph, FusionConfig.defaults())
    g = fused.graph
    (mm,) = [n for n in g.nodes if n.op == "MatMul"]
    assert mm.attrs.get("trans_a") == 1 and g.values[mm.inputs[0]].shape == (16, 16)
    assert not any(n.op in ("ReduceSum", "Transpose") for n in g.nodes)
    program = build_program(fused)
    assert program.kernel_count == 1  # the Reshapes of x and dy are views, the update an epilogue
    assert dict(program.in_place) == {"updated/m": "m", "updated/w": "w"}
    off = build_program(run_pipeline(graph, FusionConfig.all_off()).fused)
    assert off.kernel_count > 5 and off.peak_bytes > program.peak_bytes


def test_each_backward_pass_alone_can_be_switched_off() -> None:
    graph = _weight_step()
    counts = {}
    for name in ("BatchMatmulReduceFusionPass", "TbeMatmulElemwiseFusionPass", "ReshapeRemovePass"):
        fused = _matches_interpreter(graph, FusionConfig.resolve(explicit={name: False}))
        counts[name] = build_program(fused).kernel_count
    assert all(c > 1 for c in counts.values()), counts


def test_a_transcendental_stays_out_of_a_column_sum() -> None:
    """Exp over the whole domain of a sum over rows runs row-major in its own kernel."""
    g = GraphBuilder("col")
    x = g.input("x", (2, 8, 16))
    g.output(g.reduce_sum(g.mul(g.exp(x), 2.0), [0, 1], keepdims=False))
    fused = _matches_interpreter(g.build(), FusionConfig.defaults())
    (red,) = [grp for grp in fused.groups if any(fused.graph.node(n).op == "ReduceSum" for n in grp.nodes)]
    assert "Exp" not in [fused.graph.node(n).op for n in red.nodes]
    g2 = GraphBuilder("row")  # a sum over the last axis reads row-major: Exp fuses into it
    x2 = g2.input("x", (2, 8, 16))
    g2.output(g2.reduce_sum(g2.exp(x2), [2], keepdims=True))
    assert _matches_interpreter(g2.build(), FusionConfig.defaults()).kernel_count == 1
