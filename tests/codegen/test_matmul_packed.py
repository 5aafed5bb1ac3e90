"""The packed MatMul path (codegen/contraction.py): weights packed at build time, the micro-kernel
over panels of rows, the epilogue in cache; checked against the float64 reference and against
the BLAS path on shapes that leave partial register blocks in both directions."""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.codegen import microkernel
from fusiontune.codegen.contraction import pack_matmul_weights, packed_applies, packed_block
from fusiontune.codegen.plan import kernel_source
from fusiontune.ir import Graph, GraphBuilder, random_inputs, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program


def _graph(batch: tuple[int, ...], m: int, k: int, n: int, tb: int, epilogue: str, dtype: str = "float32") -> Graph:
    g = GraphBuilder("mm_packed", dtype)
    rng = np.random.default_rng(7)
    x = g.input("x", (*batch, m, k))
    w = g.const((rng.standard_normal((n, k) if tb else (k, n)) / np.sqrt(k)).astype(dtype))
    y = g.op("MatMul", x, w, **({"trans_b": 1} if tb else {}))
    if epilogue:
        y = g.add(y, g.const(rng.standard_normal(n).astype(dtype)))
        if epilogue == "gelu":
            y = g.gelu(y)
        elif epilogue == "residual":
            y = g.relu(g.add(y, g.input("r", (*batch, m, n))))
    g.output(y)
    return g.build()


def _program(graph: Graph, **schedule: object):  # type: ignore[no-untyped-def]
    group = Group("mm", tuple(n.name for n in graph.nodes), (), dict(schedule))
    fused = FusedGraph.singletons(graph).with_groups([group])
    program = build_program(fused)
    assert program.kernel_count == 1
    return program


CASES = [
    # (batch, m, k, n, trans_b, epilogue)
    ((), 1, 16, 1, 0, ""),
    ((2,), 17, 64, 64, 0, "bias"),  # ViT's rows: 34, a partial register block of rows
    ((2, 3), 5, 40, 33, 1, "gelu"),  # a transposed weight, a partial column block
    ((), 37, 300, 130, 0, "residual"),
    ((), 3, 8, 5, 0, ""),  # a reduction below 16 in a small product
    ((), 600, 24, 70, 0, "bias"),  # more rows than one panel
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, (*c[0], *c[1:5]))) + (c[5] or "plain"))
def test_packed_matmul_matches_the_reference_and_blas(case: tuple) -> None:
    graph = _graph(*case)
    src = kernel_source(graph, [n.name for n in graph.nodes], {"matmul_algo": "packed"})
    assert "uk(" in src.source and [d.fn for d in src.derived] == ["fusiontune.codegen.contraction:pack_matmul_weights"]
    inputs = random_inputs(graph)
    want = run_graph(graph, inputs, "float64")[graph.outputs[0]]
    packed = np.array(_program(graph, matmul_algo="packed").run(inputs)[graph.outputs[0]])
    blas = np.array(_program(graph, matmul_algo="blas").run(inputs)[graph.outputs[0]])
    np.testing.assert_allclose(packed, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(packed, blas, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("row_block", [1, 7, 64])
def test_packed_matmul_row_block_sets_the_panel(row_block: int) -> None:
    graph = _graph((2,), 45, 32, 48, 0, "gelu")
    nodes = [n.name for n in graph.nodes]
    plain = kernel_source(graph, nodes, {"matmul_algo": "packed"})
    split = kernel_source(graph, nodes, {"matmul_algo": "packed", "row_block": row_block})
    assert split.key != plain.key
    inputs = random_inputs(graph)
    want = run_graph(graph, inputs, "float64")[graph.outputs[0]]
    got = _program(graph, matmul_algo="packed", row_block=row_block).run(inputs)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_packed_matmul_float64_is_float64_accurate() -> None:
    graph = _graph((3,), 11, 50, 20, 1, "bias", dtype="float64")
    inputs = random_inputs(graph)
    want = run_graph(graph, inputs, "float64")[graph.outputs[0]]
    np.testing.assert_allclose(_program(graph, matmul_algo="packed").run(inputs)[graph.outputs[0]], want,
                               rtol=1e-12, atol=1e-12)


def test_blas_runs_what_the_packed_path_does_not_take() -> None:
    g = GraphBuilder("act_act")
    a, b = g.input("a", (2, 8, 32)), g.input("b", (2, 32, 24))  # no constant operand
    g.output(g.matmul(a, b))
    graph = g.build()
    src = kernel_source(graph, [n.name for n in graph.nodes], {})
    assert "uk(" not in src.source and not src.derived
    long_k = _graph((), 64, 16, 8, 0, "")  # a long run of short reductions: BLAS is faster
    assert not packed_applies(2048, 48, 8) and packed_applies(3, 5, 8) and not packed_applies(8, 8, 8192)
    assert kernel_source(long_k, [n.name for n in long_k.nodes], {"matmul_algo": "blas"}).derived == ()
    with pytest.raises(ValueError, match="matmul_algo"):
        kernel_source(long_k, [n.name for n in long_k.nodes], {"matmul_algo": "mkl"})


@pytest.mark.parametrize("avx512_blas", [False, True])
def test_the_default_is_blas_where_openblas_runs_an_avx512_sgemm(monkeypatch: pytest.MonkeyPatch,
                                                                avx512_blas: bool) -> None:
    import fusiontune.codegen.contraction as contraction

    monkeypatch.setattr(contraction, "blas_has_avx512", lambda: avx512_blas)
    graph = _graph((2,), 17, 64, 64, 0, "bias")
    src = kernel_source(graph, [n.name for n in graph.nodes], {})
    assert ("uk(" in src.source) == (not avx512_blas)
    forced = kernel_source(graph, [n.name for n in graph.nodes], {"matmul_algo": "packed"})
    assert "uk(" in forced.source


@pytest.mark.parametrize(("batch", "m", "n", "packed"), [
    ((4,), 128, microkernel.lanes("float32"), False),  # one vector of columns over 512 rows: BLAS
    ((4,), 128, microkernel.lanes("float32") // 2, False),
    ((), 8, microkernel.lanes("float32"), True),  # a few rows: BLAS's cost per call dominates
    ((4,), 128, microkernel.lanes("float32") + 1, True),  # past one vector: packed
])
def test_the_default_runs_a_one_vector_wide_product_over_many_rows_on_blas(
        monkeypatch: pytest.MonkeyPatch, batch: tuple[int, ...], m: int, n: int, packed: bool) -> None:
    import fusiontune.codegen.contraction as contraction

    monkeypatch.setattr(contraction, "blas_has_avx512", lambda: False)
    graph = _graph(batch, m, 64, n, 0, "bias")
    names = [node.name for node in graph.nodes]
    assert ("uk(" in kernel_source(graph, names, {}).source) == packed
    assert "uk(" in kernel_source(graph, names, {"matmul_algo": "packed"}).source
    inputs = random_inputs(graph)
    want = run_graph(graph, inputs, "float64")[graph.outputs[0]]
    np.testing.assert_allclose(_program(graph).run(inputs)[graph.outputs[0]], want, rtol=1e-4, atol=1e-4)


def test_openblas_names_its_kernel_family() -> None:
    """scipy's wheels bundle OpenBLAS: its kernel family for this CPU is readable, and the AVX-512
    families are the ones the default rule names."""
    from fusiontune.codegen.blas import OPENBLAS_AVX512_CORES, blas_has_avx512, openblas_core

    core = openblas_core()
    if core is None:
        pytest.skip("scipy's BLAS is not an OpenBLAS found in this process's maps")
    assert core and core.isprintable()
    assert blas_has_avx512() == (core in OPENBLAS_AVX512_CORES)


def test_packed_weights_hold_whole_column_blocks_zero_padded() -> None:
    w = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    p = pack_matmul_weights(w, 4)
    assert p.shape == (2, 6, 4)
    np.testing.assert_array_equal(p[0], w[:, :4])
    np.testing.assert_array_equal(p[1, :, 0], w[:, 4])
    assert not p[1, :, 1:].any()
    np.testing.assert_array_equal(pack_matmul_weights(np.ascontiguousarray(w.T), 4, 1), p)


def test_the_register_block_covers_the_product_with_the_least_padded_work() -> None:
    uk = packed_block(34, 64, "float32")
    assert (uk.mr, uk.nv) in microkernel.blocks()
    def cost(s: microkernel.Shape) -> float:
        return -(-34 // s.mr) * s.mr * -(-64 // s.nr) * s.nr / microkernel.efficiency(s.mr, s.nv)
    assert all(cost(uk) <= cost(microkernel.Shape("float32", mr, nv)) + 1e-9 for mr, nv in microkernel.blocks())
