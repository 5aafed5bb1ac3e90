"""The kernel cache: generated source -> compiled numba function, in memory and on disk.

Each kernel's module is written once to ``<cache dir>/k_<key>.py`` (``key`` hashes the source and
the argument types, and shapes are literals in the source) and imported; its function carries
``cache=True`` and an eager signature, so numba compiles it at import and keeps the machine code in
``__pycache__`` beside the module. A kernel that appears in many configurations therefore compiles
once per machine.

Several processes (Ray workers) may write the same kernel at once. The module is written to a
temporary file and hard-linked into place, which fails harmlessly when another process won: the
file is never rewritten, so its timestamp, which numba's cache index checks, never changes under
a reader. numba writes its own cache files through a temporary file and a rename.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numba

from fusiontune.codegen.common import KernelSource

_MEMORY: dict[str, Callable[..., None]] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where kernel modules live: ``$FUSIONTUNE_CACHE_DIR`` or ``~/.cache/fusiontune``, per numba version."""
    root = os.environ.get("FUSIONTUNE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusiontune"
    )
    path = Path(root) / f"kernels-numba{numba.__version__}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class CompiledKernel:
    """A callable kernel and how it was obtained.

    Attributes:
        fn: the numba dispatcher.
        key: the cache key.
        seconds: wall time to obtain it (import + compile or load).
        source: ``memory`` (already loaded in this process), ``disk`` (numba cache hit), or
            ``compiled``.
    """

    fn: Callable[..., None]
    key: str
    seconds: float
    source: str


def _write_once(path: Path, text: str) -> None:
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def compile_kernel(src: KernelSource) -> CompiledKernel:
    """Return the compiled kernel for ``src``, compiling only on a miss of both caches."""
    key = src.key
    with _LOCK:
        fn = _MEMORY.get(key)
    if fn is not None:
        return CompiledKernel(fn, key, 0.0, "memory")
    t0 = time.perf_counter()
    directory = cache_dir()
    path = directory / f"k_{key}.py"
    _write_once(path, f"# fusiontune kernel {key}\n" + src.source)
    modname = f"fusiontune_kernels.k_{key}"
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    fn = getattr(module, src.name)
    hits = sum(fn.stats.cache_hits.values()) if hasattr(fn, "stats") else 0
    with _LOCK:
        _MEMORY[key] = fn
    return CompiledKernel(fn, key, time.perf_counter() - t0, "disk" if hits else "compiled")


def clear_memory_cache() -> None:
    """Forget loaded kernels (tests use it to observe disk-cache behaviour)."""
    with _LOCK:
        _MEMORY.clear()
