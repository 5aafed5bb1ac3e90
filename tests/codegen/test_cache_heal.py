"""A damaged kernel cache entry heals: it is detected, quarantined, recompiled, and reported once.

Issue 14: garbage in a cached module, or a truncated numba index or data file, used to make every
later run fail, and a changed literal in a cached module ran unchecked. Each test here compiles a
real kernel into a fresh cache directory, damages one file the way a disk, a crash or a person
would, and loads the kernel again: the load succeeds, computes what the interpreter computes,
warns once naming the entry, leaves the damaged file in the quarantine folder, and the load after
that is a clean disk hit with no warning. The last tests use real competing processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fusiontune.codegen import cache_dir, compile_kernel, kernel_source
from fusiontune.codegen.cache import clear_memory_cache, module_text
from fusiontune.codegen.common import KernelSource, helper_modules
from fusiontune.ir import Graph, GraphBuilder, random_inputs, run_graph

LOGGER = "fusiontune.codegen.cache"


def _graph() -> Graph:
    g = GraphBuilder("cache_heal")
    x = g.input("x", (4, 9))
    g.output(g.sigmoid(g.sub(x, 0.25)))
    return g.build()


def _source(graph: Graph) -> KernelSource:
    return kernel_source(graph, [n.name for n in graph.nodes])


def _max_err(fn: Callable[..., None], graph: Graph, src: KernelSource) -> float:
    """Run the kernel on random inputs; its largest deviation from the interpreter."""
    inputs = random_inputs(graph, seed=3)
    buffers = {a.value: np.empty(a.shape, dtype=a.dtype) for a in src.args if a.role == "out"}
    fn(
        *[
            buffers[a.value] if a.role == "out" else inputs[a.value].reshape(a.shape)
            for a in src.args
        ]
    )
    out = graph.outputs[0]
    want = run_graph(graph, inputs, dtype=None)[out]
    return float(np.max(np.abs(buffers[out].reshape(want.shape) - want)))


# ---- damage, one file kind each --------------------------------------------------------------------
def _machine(py: Path, suffix: str) -> Path:
    (path,) = (py.parent / "__pycache__").glob(f"{py.stem}.*{suffix}")
    return path


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(max(path.stat().st_size, 64)))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _changed_literal(py: Path) -> None:
    text = py.read_text()
    assert "0.25" in text
    py.write_text(text.replace("0.25", "0.75"))


def _missing_symbol(py: Path) -> None:
    # A consistent header (its digest recomputed) over a module without the kernel function.
    head, _, body = py.read_text().partition("\n")
    body = body.replace("def kernel(", "def kernel_renamed(")
    digest = hashlib.sha256(body.encode()).hexdigest()
    py.write_text(" ".join(head.split()[:5] + [digest]) + "\n" + body)


def _not_json(path: Path) -> None:
    path.write_text("{not json")


def _unrecorded(nbc: Path) -> None:
    (nbc.parent.parent / f"{nbc.name.split('.')[0]}.sums.json").unlink()
    for p in nbc.parent.glob(f"{nbc.name.split('.')[0]}.*"):
        _age(p)


def _garbage_recorded(nbc: Path) -> None:
    # Garbage that its digest file vouches for (say, recorded by a buggy writer): numba's own
    # unpickling error is the last line of defence, and it heals the same way.
    _garbage(nbc)
    sums_path = nbc.parent.parent / f"{nbc.name.split('.')[0]}.sums.json"
    sums = json.loads(sums_path.read_text())
    sums[nbc.name] = hashlib.sha256(nbc.read_bytes()).hexdigest()
    sums_path.write_text(json.dumps(sums))


def _age(path: Path) -> None:
    old = time.time() - 3600
    os.utime(path, (old, old))


DAMAGE: dict[str, tuple[Callable[[Path], Path], Callable[[Path], None], str]] = {
    # name: (the file damaged, given the module path; how; words the warning gives as the reason)
    "garbage .py": (lambda py: py, _garbage, "first line"),
    "truncated .py": (lambda py: py, _truncate, "truncated"),
    "changed literal in .py": (lambda py: py, _changed_literal, "does not match the digest"),
    "missing symbol": (lambda py: py, _missing_symbol, "differs from this kernel's source"),
    "truncated .nbi": (lambda py: _machine(py, ".nbi"), _truncate, "recorded digest"),
    "garbage .nbi": (lambda py: _machine(py, ".nbi"), _garbage, "recorded digest"),
    "truncated .nbc": (lambda py: _machine(py, ".nbc"), _truncate, "recorded digest"),
    "garbage .nbc": (lambda py: _machine(py, ".nbc"), _garbage, "recorded digest"),
    "garbage digests": (lambda py: py.with_suffix(".sums.json"), _not_json, "unreadable"),
    "garbage .nbc with a matching digest": (
        lambda py: _machine(py, ".nbc"),
        _garbage_recorded,
        "UnpicklingError",
    ),
    "machine code without digests": (lambda py: _machine(py, ".nbc"), _unrecorded, "no recorded"),
}


@pytest.fixture
def fresh_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Graph, KernelSource, Path]:
    """A kernel compiled into an empty cache directory, and its module's path."""
    monkeypatch.setenv("FUSIONTUNE_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    graph = _graph()
    src = _source(graph)
    assert compile_kernel(src).source == "compiled"
    clear_memory_cache()
    return graph, src, cache_dir() / f"k_{src.key}.py"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_entry_is_quarantined_recompiled_and_reported_once(
    kind: str, fresh_entry: tuple[Graph, KernelSource, Path], caplog: pytest.LogCaptureFixture
) -> None:
    graph, src, py = fresh_entry
    which, damage, reason = DAMAGE[kind]
    target = which(py)
    damage(target)
    damaged = target.read_bytes()
    # Damage found by a later run: old enough that no writer can still be about to record
    # digests (fresh machine code without them is given a moment, tested with real processes).
    _age(target)

    caplog.set_level(logging.WARNING, logger=LOGGER)
    kernel = compile_kernel(src)
    assert kernel.source == "compiled"
    assert _max_err(kernel.fn, graph, src) < 1e-6  # the source's code ran, not the damaged file's
    (message,) = _warnings(caplog)
    assert str(py) in message and reason in message
    (folder,) = (py.parent / "quarantine").iterdir()
    assert str(folder) in message
    assert (folder / target.name).read_bytes() == damaged
    assert str(py) in (folder / "reason.txt").read_text()
    assert py.read_text() == module_text(src)
    if target != py and reason != "UnpicklingError":
        # found by the digests, before the import: the intact module stays, and with it the file
        # stamp that numba's index records (a module written again would make other processes'
        # indexes stale)
        assert not (folder / py.name).exists()

    caplog.clear()
    clear_memory_cache()
    again = compile_kernel(src)
    assert again.source == "disk"
    assert _max_err(again.fn, graph, src) < 1e-6
    assert _warnings(caplog) == []
    assert len(list((py.parent / "quarantine").iterdir())) == 1


def test_healthy_entry_loads_from_disk_without_warning(
    fresh_entry: tuple[Graph, KernelSource, Path], caplog: pytest.LogCaptureFixture
) -> None:
    graph, src, py = fresh_entry
    caplog.set_level(logging.WARNING, logger=LOGGER)
    kernel = compile_kernel(src)
    assert kernel.source == "disk"
    assert _max_err(kernel.fn, graph, src) < 1e-6
    assert _warnings(caplog) == []
    assert not (py.parent / "quarantine").exists()
    assert set(json.loads(py.with_suffix(".sums.json").read_text())) == {
        p.name for p in (py.parent / "__pycache__").glob(f"{py.stem}.*")
    }


def test_module_first_line_names_key_and_body_digest(
    fresh_entry: tuple[Graph, KernelSource, Path],
) -> None:
    _, src, py = fresh_entry
    head, _, body = py.read_text().partition("\n")
    assert body == src.source
    assert head.split() == [
        "#",
        "fusiontune",
        "kernel",
        src.key,
        "sha256",
        hashlib.sha256(body.encode()).hexdigest(),
    ]


def test_a_kernel_that_does_not_compile_raises_without_quarantine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Only damage is healed: a broken generated source is a bug to see, not a cache entry to hide.
    monkeypatch.setenv("FUSIONTUNE_CACHE_DIR", str(tmp_path))
    src = _source(_graph())
    assert "exp_approx(" in src.source
    broken = KernelSource(
        src.name, src.source.replace("exp_approx(", "np.no_such_function("), src.args, src.kind, 0, 0
    )
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with pytest.raises(Exception, match="no_such_function"):
        compile_kernel(broken)
    assert _warnings(caplog) == []
    assert not (cache_dir() / "quarantine").exists()


# ---- the key ---------------------------------------------------------------------------------------
def test_key_covers_numba_version(monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(_graph())
    before = src.key
    monkeypatch.setattr("numba.__version__", "0.0.0-other")
    assert src.key != before


def test_key_covers_the_fusiontune_helpers_a_kernel_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = _source(_graph())
    blas = KernelSource(
        src.name,
        "from fusiontune.codegen.blas import gemm32\n" + src.source,
        src.args,
        src.kind,
        0,
        0,
    )
    # the sigmoid calls numerics' exp_approx (the default math); numerics reads the compile target's
    # features (its exp scale), so target.py is in the key too
    assert helper_modules(blas.source) == ("fusiontune.codegen.blas", "fusiontune.codegen.numerics",
                                           "fusiontune.codegen.target")
    assert helper_modules(src.source) == ("fusiontune.codegen.numerics", "fusiontune.codegen.target")
    plain = KernelSource(src.name, src.source.replace("from fusiontune.codegen.numerics import exp_approx\n", ""),
                         src.args, src.kind, 0, 0)
    assert helper_modules(plain.source) == ()
    before, before_plain = blas.key, plain.key
    # An edited helper: the digest of its text changes, so must every key of a kernel using it.
    monkeypatch.setattr("fusiontune.codegen.common._module_digest", lambda name: "edited")
    assert blas.key != before
    assert plain.key == before_plain


# ---- real processes --------------------------------------------------------------------------------
# A child process: load the test kernel through the cache, check it against the interpreter, and
# report how it was obtained. With FT_BARRIER set it waits, after its imports, until the parent
# says go, so that the children really load at the same moment.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, os.environ["FT_TESTS"])
from test_cache_heal import _graph, _max_err, _source
from fusiontune.codegen import compile_kernel

graph = _graph()
src = _source(graph)
barrier = os.environ.get("FT_BARRIER")
if barrier:
    Path(barrier, f"ready_{os.getpid()}").touch()
    deadline = time.time() + 60
    while not Path(barrier, "go").exists() and time.time() < deadline:
        time.sleep(0.005)
kernel = compile_kernel(src)
print(json.dumps({"source": kernel.source, "key": kernel.key, "max_err": _max_err(kernel.fn, graph, src)}))
"""

WARNING_LINE = re.compile(
    r"^fusiontune: warning: kernel cache entry (\S+) was damaged .*; moved to (\S+), recompiled$"
)


def _child(cache_root: Path, barrier: Path | None = None) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "FUSIONTUNE_CACHE_DIR": str(cache_root),
        "FT_TESTS": str(Path(__file__).parent),
    }
    if barrier is not None:
        env["FT_BARRIER"] = str(barrier)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[dict[str, object], list[str]]:
    """The child's report and its warning lines; asserts it succeeded and computed right."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert float(report["max_err"]) < 1e-6, report  # type: ignore[arg-type]
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert all(WARNING_LINE.match(line) for line in warnings), warnings
    return report, warnings


def test_flipped_machine_code_in_a_loadable_nbc_never_runs(tmp_path: Path) -> None:
    # numba unpickles .nbc without any check and hands the object code to LLVM: flipped bytes in
    # the code section load fine and then crash the process (SIGSEGV, SIGILL) or compute garbage.
    # The recorded digest keeps numba from ever reading the file; a child process, so a
    # regression crashes the child, not the test run.
    _finish(_child(tmp_path))
    (nbc,) = tmp_path.glob("kernels-*/*/__pycache__/*.nbc")
    data = bytearray(nbc.read_bytes())
    start = data.find(b"\x7fELF") + 100
    data[start : start + 16] = bytes(b ^ 0x5A for b in data[start : start + 16])
    nbc.write_bytes(bytes(data))
    report, warnings = _finish(_child(tmp_path))
    assert report["source"] == "compiled"
    assert len(warnings) == 1 and nbc.name in warnings[0]
    report, warnings = _finish(_child(tmp_path))
    assert report["source"] == "disk" and warnings == []


@pytest.mark.parametrize("kind", ["garbage .py", "garbage .nbc"])
def test_concurrent_loads_of_one_damaged_entry_all_succeed_and_heal_it(
    kind: str, tmp_path: Path
) -> None:
    cache_root, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    _finish(_child(cache_root))
    (py,) = cache_root.glob("kernels-*/*/k_*.py")
    which, damage, _ = DAMAGE[kind]
    target = which(py)
    damage(target)
    damaged = target.read_bytes()

    procs = [_child(cache_root, barrier) for _ in range(4)]
    deadline = time.time() + 120
    while len(list(barrier.glob("ready_*"))) < len(procs) and time.time() < deadline:
        assert all(p.poll() is None for p in procs), "a loader died before the start line"
        time.sleep(0.01)
    (barrier / "go").touch()
    finished = [_finish(p) for p in procs]

    assert {r["source"] for r, _ in finished} <= {"compiled", "disk"}
    warnings = [w for _, ws in finished for w in ws]
    assert warnings, "nobody reported the damage"
    # The damaged file was moved exactly once, by a process that said so; nothing else was lost.
    holders = [f for f in (py.parent / "quarantine").iterdir() if (f / target.name).exists()]
    assert [(f / target.name).read_bytes() for f in holders].count(damaged) == 1
    named = {WARNING_LINE.match(w).group(2) for w in warnings}  # type: ignore[union-attr]
    assert named == {str(f) for f in (py.parent / "quarantine").iterdir()}
    assert not list(py.parent.glob(".q_*")) and not list(py.parent.glob("__pycache__/.q_*"))
    # The entry the loaders left behind is whole: a newcomer loads it from disk, silently (the
    # digests are checked against the files after they are written: cache._record).
    report, warnings = _finish(_child(cache_root))
    assert report["source"] == "disk" and warnings == []
