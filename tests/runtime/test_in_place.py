"""Updates in place: an output ``updated/<input>`` takes its input's buffer when that is safe."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fusiontune.ir import GraphBuilder, random_inputs, run_graph
from fusiontune.ir.graph import Graph
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.runtime import build_program


def _sgd(read_after: bool = False, transposed_read: bool = False) -> Graph:
    """p' = p - 0.1 * (0.9 * m + g), m' = 0.9 * m + g; optionally a later kernel reads p."""
    g = GraphBuilder("sgd")
    p, m, grad = g.input("p", (16, 8)), g.input("m", (16, 8)), g.input("grad", (16, 8))
    buf = g.add(g.mul(m, 0.9), grad)
    step = g.mul(buf, 0.1)
    if transposed_read:
        step = g.add(step, g.transpose(g.transpose(p, (1, 0)), (1, 0)))
    new_p = g.sub(p, step)
    g.output(buf, new_p)
    names = {buf.name: "updated/m", new_p.name: "updated/p"}
    if read_after:
        late = g.exp(g.mul(p, g.relu(new_p)))
        g.output(late)
        names[late.name] = "late"
    return _renamed(g.build(), names)


def _renamed(graph: Graph, names: dict[str, str]) -> Graph:
    """``graph`` with some values renamed (the builder names values after their nodes)."""
    r = lambda v: names.get(v, v)  # noqa: E731
    values = {r(k): replace(v, name=r(k)) for k, v in graph.values.items()}
    nodes = tuple(replace(n, inputs=tuple(map(r, n.inputs)), outputs=tuple(map(r, n.outputs))) for n in graph.nodes)
    return Graph(graph.name, values, nodes, graph.inputs, tuple(map(r, graph.outputs)), graph.constants)


def _one_kernel(graph: Graph) -> FusedGraph:
    from fusiontune.passes.fused_graph import Group

    loop = [n.name for n in graph.nodes if n.op not in ("Exp", "Transpose")]
    rest = [n.name for n in graph.nodes if n.name not in loop]
    groups = [Group("step", tuple(loop))] + [Group(n, (n,)) for n in rest]
    return FusedGraph.singletons(graph).with_groups(groups)


def test_an_optimizer_kernel_updates_its_inputs_in_place_and_the_peak_drops() -> None:
    graph = _sgd()
    program = build_program(_one_kernel(graph))
    assert dict(program.in_place) == {"updated/m": "m", "updated/p": "p"}
    inputs = random_inputs(graph)
    nbytes = inputs["p"].nbytes
    # The outputs add nothing: inputs and (one-element, 64-byte aligned) constants only.
    assert program.plan.io_bytes == sum(a.nbytes for a in inputs.values()) + 64 * len(graph.constants)
    assert program.plan.naive_bytes >= program.plan.peak_bytes + 2 * nbytes
    ref = run_graph(graph, inputs, "float64")
    snapshot = {k: v.copy() for k, v in inputs.items()}
    first = {k: v.copy() for k, v in program.run(inputs).items()}
    second = {k: v.copy() for k, v in program.run(inputs).items()}  # same arrays: bound again
    for k in ref:
        np.testing.assert_allclose(first[k], ref[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(first[k], second[k])
    for k in inputs:
        np.testing.assert_array_equal(inputs[k], snapshot[k])  # the caller's arrays are untouched


def test_an_input_read_after_its_update_keeps_its_own_buffer() -> None:
    graph = _sgd(read_after=True)
    program = build_program(_one_kernel(graph))
    assert "updated/p" not in program.in_place and program.in_place.get("updated/m") == "m"
    inputs = random_inputs(graph)
    ref = run_graph(graph, inputs, "float64")
    out = program.run(inputs)
    np.testing.assert_allclose(out["late"], ref["late"], rtol=1e-5)


def test_a_graph_without_updated_outputs_has_nothing_in_place() -> None:
    g = GraphBuilder("plain")
    x = g.input("x", (4, 4))
    g.output(g.mul(x, 2.0))
    assert not build_program(FusedGraph.singletons(g.build())).in_place
