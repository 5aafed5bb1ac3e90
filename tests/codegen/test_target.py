"""The compile target: numba's loops use the CPU's widest vectors, and each target caches apart.

Every test runs a fresh interpreter, because numba fixes its CPU features when its first compile
creates the code generator, once per process.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import pytest

X86 = platform.machine() in ("x86_64", "AMD64")
AVX512 = X86 and bool(llvm.get_host_cpu_features().get("avx512f"))

PROBE = r"""
import json, sys
{before}
import numba
import numpy as np
import fusiontune.codegen
from fusiontune.codegen.cache import cache_dir

@numba.njit("void(float32[::1], float32[::1])")
def add1(a, b):
    for i in range(a.size):
        b[i] = a[i] + np.float32(1.0)

asm = add1.inspect_asm(add1.signatures[0])
{kernel}
print(json.dumps({{"features": numba.config.CPU_FEATURES, "zmm": "zmm" in asm, "dir": str(cache_dir())}}))
"""
# a real kernel through the disk cache, which warns on stderr when it finds an entry damaged
KERNEL = """
from fusiontune.codegen import compile_kernel, kernel_source
from fusiontune.ir import GraphBuilder
g = GraphBuilder("target")
x = g.input("x", (4, 9))
g.output(g.sigmoid(g.sub(x, 0.25)))
graph = g.build()
compile_kernel(kernel_source(graph, [n.name for n in graph.nodes]))
"""


def _probe(tmp_path: Path, before: str = "", kernel: bool = False, **env: str) -> dict[str, object]:
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME", "FUSIONTUNE_VECTOR_WIDTH")}
    full.update(env, FUSIONTUNE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", PROBE.format(before=before, kernel=KERNEL if kernel else "")],
                          env=full, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "damaged" not in done.stderr, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not AVX512, reason="needs an AVX-512 CPU")
def test_loops_use_512_bit_vectors(tmp_path: Path) -> None:
    got = _probe(tmp_path)
    assert str(got["features"]).endswith(",-prefer-256-bit")
    assert got["zmm"], "a float32 loop compiled after importing fusiontune.codegen used no zmm register"


@pytest.mark.skipif(not X86, reason="x86 feature names")
def test_opt_out_and_user_settings_are_left_alone(tmp_path: Path) -> None:
    assert _probe(tmp_path, FUSIONTUNE_VECTOR_WIDTH="256")["features"] is None
    mine = llvm.get_host_cpu_features().flatten()
    assert _probe(tmp_path, NUMBA_CPU_FEATURES=mine)["features"] == mine
    # numba's code generator already made (a program compiled numba code first): not touched
    first = "import numba\nnumba.njit(lambda x: x + 1)(1)"
    assert _probe(tmp_path, before=first)["features"] is None


@pytest.mark.skipif(not X86, reason="x86 feature names")
def test_each_target_has_its_own_cache_folder(tmp_path: Path) -> None:
    """Two feature sets, one cache root, the same kernel compiled by each in turn: two folders, one
    per target, each a clean load for its own target. (With one folder for both, a benchmark run
    under other ``NUMBA_CPU_FEATURES`` left three entries that the next ordinary run quarantined
    as damaged and compiled again: numba had written its other machine code into them.)"""
    host = llvm.get_host_cpu_features().flatten()
    a = _probe(tmp_path, kernel=True, NUMBA_CPU_FEATURES=f"{host},+prefer-256-bit")
    b = _probe(tmp_path, kernel=True, NUMBA_CPU_FEATURES=f"{host},-prefer-256-bit")
    again = _probe(tmp_path, kernel=True, NUMBA_CPU_FEATURES=f"{host},+prefer-256-bit")
    assert a["dir"] != b["dir"]
    assert a["dir"] == again["dir"]
    assert Path(str(a["dir"])).parent == Path(str(b["dir"])).parent
