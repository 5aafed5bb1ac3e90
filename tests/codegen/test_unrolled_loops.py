"""Generated kernels give LLVM no literal-count loop around another loop to unroll whole.

LLVM unrolls a loop of a constant trip count completely when it judges the copies small enough,
and a loop around a vectorized row loop (with its remainder and alias checks) qualified: a
grouped 1x1 conv of ShuffleNet (28 channels of 28 rows) compiled in 13 s, its 3x3 s2 average
pool in 8 s, and neither ran faster than with the outer counts read at run time (2 s each to
compile). The row loops themselves keep their literal counts where unrolling is what makes them
fast; only loops that contain loops are checked here. Each kernel is also run against the
float64 interpreter.
"""

from __future__ import annotations

import ast

import numpy as np
import pytest

from fusiontune.codegen import kernel_source
from fusiontune.ir import Graph, GraphBuilder, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program

UNROLL_MIN = 8
"""Outer loops of fewer literal iterations than this are left alone (a 3x3 window's taps)."""


def literal_nests(source: str) -> list[str]:
    """The loops of ``source`` that run ``range(<literal of UNROLL_MIN or more>)`` and contain a loop."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.For) or not isinstance(node.iter, ast.Call):
            continue
        if ast.unparse(node.iter.func) == "numba.prange":
            continue  # a parallel loop's count is the schedule's, passed to its gufunc at run time
        args = node.iter.args
        count = args[0] if len(args) == 1 else None
        if not (isinstance(count, ast.Constant) and isinstance(count.value, int) and count.value >= UNROLL_MIN):
            continue
        if any(isinstance(inner, ast.For) for stmt in node.body for inner in ast.walk(stmt)):
            found.append(ast.unparse(node).splitlines()[0])
    return found


def test_the_checker_finds_a_literal_nest() -> None:
    src = "def k(a):\n    for c in range(28):\n        for j in range(a.shape[0]):\n            a[j] = c\n"
    assert literal_nests(src) == ["for c in range(28):"]
    assert literal_nests(src.replace("range(28)", "range(4)")) == []
    assert literal_nests(src.replace("range(28)", "range(opaque(28))")) == []


def _graph(op: str, xs: tuple[int, ...], ws: tuple[int, ...] | None, **attrs: object) -> Graph:
    g = GraphBuilder("unroll_test")
    x = g.input("x", xs)
    if ws is None:
        y = g.op(op, x, **attrs)
    else:
        w = g.const(np.random.default_rng(1).standard_normal(ws).astype(np.float32))
        y = g.op(op, x, w, **attrs)
    g.output(y)
    return g.build()


CASES = {
    # ShuffleNet's grouped 1x1 conv on the plane kernel
    "grouped_1x1": ("Conv", (1, 112, 28, 28), (112, 28, 1, 1), {"group": 4}, {"conv_algo": "plane"}),
    "depthwise_3x3": ("Conv", (1, 32, 28, 28), (32, 1, 3, 3), {"group": 32, "pads": (1, 1, 1, 1)},
                      {"conv_algo": "plane"}),
    "avgpool_3x3_s2": ("AveragePool", (1, 24, 28, 28), None,
                       {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, {}),
    "maxpool_3x3_s2": ("MaxPool", (1, 24, 28, 28), None,
                       {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, {}),
    "maxpool_3x3_s1": ("MaxPool", (1, 8, 30, 30), None, {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_kernel_has_no_literal_nest_and_matches_reference(case: str) -> None:
    op, xs, ws, attrs, schedule = CASES[case]
    graph = _graph(op, xs, ws, **attrs)
    names = [n.name for n in graph.nodes]
    src = kernel_source(graph, names, schedule)
    assert literal_nests(src.source) == [], src.source
    prog = build_program(FusedGraph(graph, (Group("all", tuple(names), (), schedule),)))
    x = np.random.default_rng(0).standard_normal(xs).astype(np.float32)
    out = graph.outputs[0]
    np.testing.assert_allclose(prog.run({"x": x})[out], run_graph(graph, {"x": x}, dtype="float64")[out],
                               rtol=1e-4, atol=1e-5)
