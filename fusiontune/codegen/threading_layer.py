"""numba's threading layer: one that does not stall when other work shares the cores.

numba's parallel loops run on TBB, OpenMP or its own workqueue, the first that loads. With GNU
OpenMP every parallel region splits its loop statically, one chunk per thread, and ends at a
barrier: when another process holds one of the cores, the region waits for a thread that is not
running, a scheduler time slice per kernel. A 13-kernel transformer_block program ran at a 44 ms
median instead of 0.56 ms beside other work (``benchmarks/bench_threads.py``). TBB's workers
steal: a chunk nobody has started is run by whichever thread is free, the caller included, so a
descheduled worker delays nothing it has not started. :func:`configure_threading` therefore loads
TBB when the ``tbb`` package is installed (its ``libtbb.so.12`` is not on the loader's path in a
virtual environment, so it is loaded by path first) and asks numba for it.
``FUSIONTUNE_THREADING=omp`` (or ``workqueue``, ``tbb``) chooses a layer instead; numba's own
``NUMBA_THREADING_LAYER`` wins over both.

Codegen calls :func:`configure_threading` before it compiles or loads a kernel, and so does every
other parallel function fusiontune defines (the roofline's copy and sgemm), before its first use.
Asking numba for its thread count also starts its threads, on whatever layer loads first. A
sweep's driver asked first for its machine record, and each Ray worker set its thread share before
loading anything, so both ran on OpenMP: beside another process every kernel of the confirmation
waited a time slice (55.7 ms against 0.56 ms). So fusiontune reads and sets the count only
through :func:`num_threads` and :func:`set_num_threads`, which configure first, and a worker's
measurement records its layer.
"""

from __future__ import annotations

import ctypes
import os
from importlib import metadata
from pathlib import Path

from fusiontune.errors import UserError

THREADING_ENV = "FUSIONTUNE_THREADING"
LAYERS = ("tbb", "omp", "workqueue")

_CONFIGURED: str | None = None


def tbb_library() -> Path | None:
    """The ``libtbb.so.12`` of the installed ``tbb`` distribution, or None."""
    try:
        files = metadata.distribution("tbb").files or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.startswith("libtbb.so.12"):
            path = Path(str(f.locate())).resolve()
            if path.is_file():
                return path
    return None


def configure_threading() -> str:
    """Choose numba's threading layer before its first parallel loop (idempotent).

    Returns:
        What was asked of numba: ``"tbb"``, ``"omp"`` or ``"workqueue"``, or ``"default"`` when
        TBB is not installed and nothing was asked (numba then takes the first layer it loads).

    Raises:
        UserError: ``FUSIONTUNE_THREADING`` names no layer, or tbb when it is not installed.
    """
    global _CONFIGURED
    if _CONFIGURED is not None:
        return _CONFIGURED
    import numba

    wanted = os.environ.get(THREADING_ENV, "").strip().lower() or None
    if wanted is not None and wanted not in LAYERS:
        raise UserError(f"{THREADING_ENV}={wanted}: expected one of {', '.join(LAYERS)}")
    if os.environ.get("NUMBA_THREADING_LAYER"):
        _CONFIGURED = numba.config.THREADING_LAYER
        return _CONFIGURED
    if wanted in (None, "tbb"):
        library = tbb_library()
        if library is not None:
            # Loaded by path with its symbols global: numba's tbbpool extension, which needs
            # libtbb.so.12 by soname, then finds it already in the process.
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            wanted = "tbb"
        elif wanted == "tbb":
            raise UserError(f"{THREADING_ENV}=tbb: the tbb package is not installed (pip install tbb)")
    if wanted is not None:
        numba.config.THREADING_LAYER = wanted
    _CONFIGURED = wanted or "default"
    return _CONFIGURED


def num_threads() -> int:
    """numba's thread count for the calling thread, the layer chosen first."""
    configure_threading()
    import numba

    return int(numba.get_num_threads())


def set_num_threads(n: int) -> None:
    """Set numba's thread count for the calling thread, the layer chosen first."""
    configure_threading()
    import numba

    numba.set_num_threads(n)


def threading_layer() -> str:
    """The layer numba runs parallel loops on in this process (after its first parallel loop),
    else what :func:`configure_threading` asked for."""
    import numba

    try:
        return str(numba.threading_layer())
    except ValueError:  # no parallel loop has run yet
        return configure_threading()
