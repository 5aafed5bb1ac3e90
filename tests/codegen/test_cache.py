"""The kernel cache: memory within a process, disk across processes, safe under concurrent writers.

DESIGN section 6: a kernel is cached by the hash of its source and argument types, in memory and
on disk, so a group that appears in many configurations compiles once per machine, and several
processes (Ray workers) writing the same kernel at once must not corrupt the cache. The
cross-process tests run real ``python -c`` subprocesses against a fresh cache directory each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusiontune.codegen import cache_dir, compile_kernel, kernel_source
from fusiontune.codegen.cache import clear_memory_cache
from fusiontune.ir import Graph, GraphBuilder

# A child process: generate one kernel, obtain it through the cache, report how, and check that it
# computes what the interpreter computes. With FT_BARRIER set it waits, after its imports, until
# the parent says go, so that concurrent children really compile at the same moment.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
from fusiontune.codegen import cache_dir, compile_kernel, kernel_source
from fusiontune.ir import GraphBuilder, random_inputs, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program

cols = int(sys.argv[1])
g = GraphBuilder("cache_probe")
x = g.input("x", (8, cols))
g.output(g.tanh(g.add(g.mul(x, 3.0), g.reduce_sum(g.exp(x)))))
graph = g.build()
nodes = tuple(n.name for n in graph.nodes)
src = kernel_source(graph, nodes)
barrier = os.environ.get("FT_BARRIER")
if barrier:
    Path(barrier, f"ready_{os.getpid()}").touch()
    deadline = time.time() + 60
    while not Path(barrier, "go").exists() and time.time() < deadline:
        time.sleep(0.005)
kernel = compile_kernel(src)
prog = build_program(FusedGraph.singletons(graph).with_groups([Group("all", nodes)]))
inputs = random_inputs(graph, seed=1)
got = prog.run(inputs)[graph.outputs[0]]
want = run_graph(graph, inputs, dtype=None)[graph.outputs[0]]
print(json.dumps({
    "source": kernel.source,
    "key": kernel.key,
    "program_cache": prog.kernels[0].cache,
    "dir": str(cache_dir()),
    "max_err": float(np.max(np.abs(got - want))),
}))
"""


def run_child(
    cache_root: Path, cols: int = 16, barrier: Path | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "FUSIONTUNE_CACHE_DIR": str(cache_root)}
    if barrier is not None:
        env["FT_BARRIER"] = str(barrier)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cols)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, object]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["max_err"] < 1e-5, report
    return report


def _graph(cols: int) -> Graph:
    g = GraphBuilder("cache_in_process")
    x = g.input("x", (4, cols))
    g.output(g.sigmoid(g.sub(x, 0.25)))
    return g.build()


# ---- in process ------------------------------------------------------------------------------------
def test_second_compile_in_process_comes_from_memory() -> None:
    graph = _graph(11)
    src = kernel_source(graph, [n.name for n in graph.nodes])
    first = compile_kernel(src)
    second = compile_kernel(src)
    assert first.source in ("compiled", "disk", "memory")
    assert second.source == "memory"
    assert second.fn is first.fn
    assert second.key == first.key == src.key


def test_kernel_module_is_written_under_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSIONTUNE_CACHE_DIR", str(tmp_path))
    graph = _graph(13)
    src = kernel_source(graph, [n.name for n in graph.nodes])
    clear_memory_cache()
    assert compile_kernel(src).source == "compiled"
    module = cache_dir() / f"k_{src.key}.py"
    assert module.is_relative_to(tmp_path)
    assert src.source in module.read_text()
    clear_memory_cache()  # forget the loaded function: the next call must find numba's disk cache
    assert compile_kernel(src).source == "disk"
    assert compile_kernel(src).source == "memory"


def test_cache_key_depends_on_shapes() -> None:
    a, b = _graph(11), _graph(12)
    ka = kernel_source(a, [n.name for n in a.nodes]).key
    kb = kernel_source(b, [n.name for n in b.nodes]).key
    assert ka != kb
    assert ka == kernel_source(a, [n.name for n in a.nodes]).key


# ---- across processes ------------------------------------------------------------------------------
def test_fresh_process_loads_kernel_from_disk(tmp_path: Path) -> None:
    first = result(run_child(tmp_path))
    assert first["source"] == "compiled"
    second = result(run_child(tmp_path))
    assert second["source"] == "disk"
    assert second["key"] == first["key"]
    assert second["program_cache"] == "memory"
    assert Path(str(second["dir"])).is_relative_to(tmp_path)


def test_concurrent_writers_share_one_cache_dir(tmp_path: Path) -> None:
    cache_root, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    procs = [run_child(cache_root, cols=24, barrier=barrier) for _ in range(3)]
    deadline = time.time() + 120
    while len(list(barrier.glob("ready_*"))) < len(procs) and time.time() < deadline:
        assert all(p.poll() is None for p in procs), "a writer died before the start line"
        time.sleep(0.01)
    (barrier / "go").touch()
    reports = [result(p) for p in procs]
    assert len({r["key"] for r in reports}) == 1
    assert {r["source"] for r in reports} <= {"compiled", "disk"}
    directory = Path(str(reports[0]["dir"]))
    assert not list(directory.glob(".tmp_*")), "a writer left its temporary file behind"
    assert len(list(directory.glob("k_*.py"))) == 1
    # The cache the writers left behind is whole: a newcomer loads the kernel without compiling.
    assert result(run_child(cache_root, cols=24))["source"] == "disk"
