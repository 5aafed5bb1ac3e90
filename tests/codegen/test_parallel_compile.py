"""A cold build compiles its kernels in parallel processes (cache.compile_kernels).

Real child processes (``python -m fusiontune.codegen._compile_worker``) against a fresh cache
directory per test; every kernel is checked against the interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fusiontune.codegen import KernelSource, cache_dir, kernel_source
from fusiontune.codegen.cache import (
    _cache_hits,
    clear_memory_cache,
    compile_jobs,
    compile_kernel,
    compile_kernels,
)
from fusiontune.errors import UserError
from fusiontune.ir import Graph, GraphBuilder, random_inputs, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program, precompile


def _graph(cols: int) -> Graph:
    g = GraphBuilder("parallel_probe")
    x = g.input("x", (4, cols))
    g.output(g.tanh(g.add(g.mul(x, 3.0), g.reduce_sum(g.exp(x)))))
    return g.build()


def _source(cols: int) -> KernelSource:
    graph = _graph(cols)
    return kernel_source(graph, [n.name for n in graph.nodes])


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FUSIONTUNE_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    yield tmp_path
    clear_memory_cache()


def test_a_cold_build_compiles_in_children_and_every_kernel_matches_the_interpreter(
    fresh_cache: Path,
) -> None:
    srcs = [_source(cols) for cols in range(21, 29)]
    got = compile_kernels(srcs + srcs[:2], jobs=3)
    assert [g.source for g in got] == ["compiled"] * 8 + ["memory"] * 2
    assert all(g.seconds > 0 for g in got[:8])
    # A kernel a child compiled was loaded here from numba's disk cache; this process compiled
    # the others itself. Eight kernels at a few tenths of a second each outlast a child's start.
    from_children = sum(1 for g in got[:8] if _cache_hits(g.fn))
    assert 1 <= from_children < 8
    for src in srcs:
        assert (cache_dir() / f"k_{src.key}.sums.json").exists()
    for cols in (21, 28):
        graph = _graph(cols)
        prog = build_program(
            FusedGraph.singletons(graph).with_groups(
                [Group("all", tuple(n.name for n in graph.nodes))]
            )
        )
        assert prog.kernels[0].cache == "memory"
        inputs = random_inputs(graph, seed=cols)
        want = run_graph(graph, inputs, dtype=None)[graph.outputs[0]]
        np.testing.assert_allclose(prog.run(inputs)[graph.outputs[0]], want, rtol=1e-5, atol=1e-6)


def test_the_child_compiles_what_it_claims_into_the_cache(
    fresh_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    srcs = [_source(cols) for cols in (31, 32)]
    work = tmp_path_factory.mktemp("tasks")
    (work / "tasks.json").write_text(
        json.dumps([{"key": s.key, "name": s.name, "source": s.source} for s in srcs])
    )
    (work / f"{srcs[0].key}.claim").touch()  # another process's claim: the child leaves it
    proc = subprocess.run(
        [sys.executable, "-m", "fusiontune.codegen._compile_worker", str(work)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (work / f"{srcs[0].key}.s").exists()
    assert float((work / f"{srcs[1].key}.s").read_text()) > 0
    assert compile_kernel(srcs[1]).source == "disk"
    assert compile_kernel(srcs[0]).source == "compiled"


def test_a_kernel_that_cannot_compile_raises_as_it_would_serially(fresh_cache: Path) -> None:
    srcs = [_source(cols) for cols in range(41, 45)]
    bad = replace(
        srcs[2], source=srcs[2].source.replace("def kernel(", "def kernel(undefined_name, ", 1)
    )
    assert bad.source != srcs[2].source
    with pytest.raises(Exception) as serial:
        compile_kernel(bad)
    clear_memory_cache()
    with pytest.raises(type(serial.value)):
        compile_kernels([srcs[0], srcs[1], bad, srcs[3]], jobs=2)


def test_the_compile_jobs_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSIONTUNE_COMPILE_JOBS", "3")
    assert compile_jobs() == 3
    monkeypatch.setenv("FUSIONTUNE_COMPILE_JOBS", "0")
    with pytest.raises(UserError, match="FUSIONTUNE_COMPILE_JOBS=0"):
        compile_jobs()


def test_precompile_compiles_what_the_programs_will_load(fresh_cache: Path) -> None:
    graphs = [_graph(cols) for cols in (51, 52, 53, 54)]
    fused = [
        FusedGraph.singletons(g).with_groups([Group("all", tuple(n.name for n in g.nodes))])
        for g in graphs
    ]
    assert precompile(fused, jobs=2) == 4
    assert precompile(fused, jobs=2) == 0  # all in the cache now
    for g, f in zip(graphs, fused, strict=True):
        prog = build_program(f)
        assert prog.kernels[0].cache in ("memory", "disk")
        inputs = random_inputs(g, seed=3)
        want = run_graph(g, inputs, dtype=None)[g.outputs[0]]
        np.testing.assert_allclose(prog.run(inputs)[g.outputs[0]], want, rtol=1e-5, atol=1e-6)
