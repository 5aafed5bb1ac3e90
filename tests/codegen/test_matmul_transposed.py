"""MatMul with trans_a / trans_b: the shape rule, the reference and the BLAS kernel agree."""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.ir import GraphBuilder, random_inputs, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program

M, K, N = 24, 40, 16


def _stored(shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2]) if transposed else shape


def _graph(ta: int, tb: int, batch: tuple[int, ...], b_batch: tuple[int, ...], epilogue: bool, dtype: str):
    g = GraphBuilder("mm_t", dtype)
    a = g.input("a", _stored((*batch, M, K), bool(ta)))
    b = g.input("b", _stored((*b_batch, K, N), bool(tb)))
    attrs = {k: v for k, v in (("trans_a", ta), ("trans_b", tb)) if v}
    y = g.op("MatMul", a, b, **attrs)
    if epilogue:
        bias = g.input("bias", (N,))
        y = g.relu(g.add(y, bias))
    g.output(y)
    return g.build()


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("batch,b_batch", [((), ()), ((3,), ()), ((2, 3), (3,)), ((3,), (3,))])
def test_transposed_operands_match_the_interpreter(ta: int, tb: int, batch: tuple[int, ...], b_batch: tuple[int, ...]) -> None:
    graph = _graph(ta, tb, batch, b_batch, epilogue=False, dtype="float32")
    assert graph.values[graph.outputs[0]].shape == (*np.broadcast_shapes(batch, b_batch), M, N)
    inputs = random_inputs(graph)
    ref = run_graph(graph, inputs, "float64")
    a = np.swapaxes(inputs["a"], -1, -2) if ta else inputs["a"]
    b = np.swapaxes(inputs["b"], -1, -2) if tb else inputs["b"]
    np.testing.assert_allclose(ref[graph.outputs[0]], np.matmul(a.astype(np.float64), b), rtol=1e-12)
    out = build_program(FusedGraph.singletons(graph)).run(inputs)
    np.testing.assert_allclose(out[graph.outputs[0]], ref[graph.outputs[0]], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ta,tb", [(1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("row_block", [0, 7])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_transposed_operands_with_an_epilogue_in_row_blocks(ta: int, tb: int, row_block: int, dtype: str) -> None:
    graph = _graph(ta, tb, (2,), (), epilogue=True, dtype=dtype)
    schedule = {"row_block": row_block} if row_block else {}
    fused = FusedGraph.singletons(graph).with_groups([Group("mm", tuple(n.name for n in graph.nodes), (), schedule)])
    program = build_program(fused)
    assert program.kernel_count == 1
    inputs = random_inputs(graph)
    ref = run_graph(graph, inputs, "float64")[graph.outputs[0]]
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(program.run(inputs)[graph.outputs[0]], ref, rtol=tol, atol=tol)
