"""The roofline: measured memory bandwidth, the time bound of a kernel, and machine identity.

A fused kernel that moves ``B`` bytes (its minimum traffic: inputs read once, outputs written once)
and performs ``F`` flops cannot run faster than ``max(B / bandwidth, F / peak_flops)``. The
bandwidth and the peak are *measured* here, with the same machinery the kernels use (a numba
``prange`` loop; row blocks of single-threaded BLAS sgemm), so "% of bound" compares like with like.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_DEFAULT_NBYTES = 256 << 20


@functools.cache
def copy_kernel() -> Callable[[np.ndarray, np.ndarray], None]:
    """The parallel numba copy `dst[i] = src[i]` that copy bandwidth is measured with."""
    import numba  # lazy: importing fusiontune.measure must not start numba

    from fusiontune.codegen.threading_layer import configure_threading

    configure_threading()

    @numba.njit(parallel=True, cache=True)
    def parallel_copy(dst: np.ndarray, src: np.ndarray) -> None:
        for i in numba.prange(src.shape[0]):
            dst[i] = src[i]

    return parallel_copy  # type: ignore[no-any-return]


def _best_copy_rate(
    copy: Callable[[np.ndarray, np.ndarray], Any], nbytes: int, repeat: int
) -> float:
    """Bytes per second of the fastest of ``repeat`` copies, after one untimed copy."""
    if nbytes < 4 or repeat < 1:
        raise ValueError(f"need nbytes >= 4 and repeat >= 1, got {nbytes} and {repeat}")
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    copy(dst, src)  # compiles (numba) and faults every page of dst in
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        copy(dst, src)
        best = min(best, time.perf_counter_ns() - t0)
    # Counted as STREAM does: one read and one write per element (write-allocate traffic not counted).
    return 2 * src.nbytes / (max(best, 1) * 1e-9)


@functools.cache
def measure_copy_bandwidth(nbytes: int = _DEFAULT_NBYTES, repeat: int = 5) -> float:
    """Copy bandwidth of a parallel numba kernel, cached per process and arguments.

    Args:
        nbytes: size of each of the two float32 arrays; keep it well above the last-level
            cache to measure memory rather than cache bandwidth.
        repeat: timed copies; the fastest counts.

    Returns:
        Bytes per second, counting the bytes read plus the bytes written.
    """
    return _best_copy_rate(copy_kernel(), nbytes, repeat)


@functools.cache
def numpy_copy_bandwidth(nbytes: int = _DEFAULT_NBYTES, repeat: int = 5) -> float:
    """Copy bandwidth of ``np.copyto`` (one thread), for comparison with the numba kernel.

    Args:
        nbytes: size of each of the two float32 arrays.
        repeat: timed copies; the fastest counts.

    Returns:
        Bytes per second, counting the bytes read plus the bytes written.
    """
    return _best_copy_rate(np.copyto, nbytes, repeat)


_PEAK_ROWS, _PEAK_K, _PEAK_N = 512, 1024, 1024


@functools.cache
def measure_peak_flops(threads: int | None = None, repeat: int = 10) -> float:
    """The float32 FLOP peak the kernels can reach: the faster of a large sgemm as a MatMul
    kernel runs one, and the packed conv kernels' micro-kernel on operands in L1
    (codegen/microkernel.py, which outruns OpenBLAS here: about 205 against 170 GFLOP/s a core).

    What is measured: ``C = A @ B`` with ``A`` of ``threads x 512`` rows by 1024, ``B`` 1024 by
    1024, split into ``threads`` row blocks of 512, each block one single-threaded BLAS sgemm
    (scipy's, through :mod:`fusiontune.codegen.blas`, the binding every generated kernel calls),
    the blocks in parallel in a numba ``prange`` over numba's threads. That is the way a
    contraction kernel uses the machine (BLAS is held to one thread per process,
    :mod:`fusiontune.runtime.threads`), so it is the FLOP roof of this process's kernels, not the
    machine's theoretical peak. Counted as ``2 m n k`` flops; the fastest of ``repeat`` calls,
    after one untimed call (numba compiles it once per machine, then loads it from its cache).
    Cached per process and arguments: about 1 s, once.

    Args:
        threads: numba threads to run on; None: numba's current count (the run's).
        repeat: timed calls; the fastest counts.

    Returns:
        Float32 flop/s.
    """
    import numba  # lazy: importing fusiontune.measure must not start numba

    from fusiontune.codegen.threading_layer import num_threads, set_num_threads
    from fusiontune.measure._peak import UK_SHAPE, parallel_microkernel, parallel_sgemm
    from fusiontune.runtime.threads import single_threaded_blas

    single_threaded_blas()
    previous = num_threads()
    chunks = threads or previous
    set_num_threads(min(chunks, numba.config.NUMBA_NUM_THREADS))
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((chunks * _PEAK_ROWS, _PEAK_K), dtype=np.float32)
        b = rng.standard_normal((_PEAK_K, _PEAK_N), dtype=np.float32)
        c = np.zeros((chunks * _PEAK_ROWS, _PEAK_N), dtype=np.float32)
        parallel_sgemm(a, b, c, chunks)
        best = math.inf
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter_ns()
            parallel_sgemm(a, b, c, chunks)
            best = min(best, time.perf_counter_ns() - t0)
        sgemm = 2.0 * chunks * _PEAK_ROWS * _PEAK_K * _PEAK_N / (max(best, 1) * 1e-9)
        k, calls, mr, nr = 32, 400, UK_SHAPE.mr, UK_SHAPE.nr
        ua = rng.standard_normal((chunks, 9 * k * mr), dtype=np.float32)
        ub = rng.standard_normal((chunks, 9 * k * nr), dtype=np.float32)
        uc = np.zeros((chunks, mr * nr), dtype=np.float32)
        sa = np.arange(9, dtype=np.int64) * k * mr
        sb = np.arange(9, dtype=np.int64) * k * nr
        parallel_microkernel(ua, ub, uc, sa, sb, k, calls, chunks)
        best = math.inf
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter_ns()
            parallel_microkernel(ua, ub, uc, sa, sb, k, calls, chunks)
            best = min(best, time.perf_counter_ns() - t0)
        micro = 2.0 * chunks * calls * 9 * k * mr * nr / (max(best, 1) * 1e-9)
    finally:
        set_num_threads(previous)
    return max(sgemm, micro)


def kernel_bound(
    bytes_moved: float, flops: float, bandwidth: float, peak_flops: float | None = None
) -> float:
    """The roofline lower bound on a kernel's time.

    Args:
        bytes_moved: minimum bytes the kernel must read and write.
        flops: floating-point operations it performs.
        bandwidth: memory bandwidth in bytes/s (e.g. :func:`measure_copy_bandwidth`).
        peak_flops: peak flop/s, or None to bound by memory traffic alone.

    Returns:
        Seconds: ``max(bytes_moved / bandwidth, flops / peak_flops)``.

    Raises:
        ValueError: a non-positive bandwidth or peak.
    """
    if bandwidth <= 0 or (peak_flops is not None and peak_flops <= 0):
        raise ValueError(
            f"bandwidth and peak_flops must be positive, got {bandwidth} and {peak_flops}"
        )
    bound = bytes_moved / bandwidth
    if peak_flops is not None:
        bound = max(bound, flops / peak_flops)
    return bound


def percent_of_bound(time_s: float, bound_s: float) -> float:
    """How close a measured time is to its bound: 100 means the kernel runs at the roofline.

    Args:
        time_s: measured seconds per call.
        bound_s: the bound from :func:`kernel_bound`.

    Returns:
        ``100 * bound_s / time_s``; NaN when ``time_s`` is not positive (a failed measurement).
    """
    if not time_s > 0:
        return math.nan
    return 100.0 * bound_s / time_s


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """Identity of this machine, stored with every result.

    Returns:
        ``hostname``, ``cpu_model``, ``cpu_count`` (logical CPUs), ``cpus_usable`` (this
        process's affinity), ``numba_threads``, ``threading_layer`` (numba's: tbb, omp...),
        ``numpy``, ``numba``, ``python``, ``platform``.
    """
    import numba

    from fusiontune.codegen.threading_layer import num_threads, threading_layer

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "cpus_usable": usable,
        "numba_threads": num_threads(),
        "threading_layer": threading_layer(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
