"""The sgemm that the float32 FLOP peak is measured with (imported lazily: it loads numba and BLAS).

A module of its own so that numba can cache the compiled function on disk: it calls the BLAS
binding of the generated kernels (:mod:`fusiontune.codegen.blas`) by symbol name, as they do.
"""

from __future__ import annotations

import numba
import numpy as np

from fusiontune.codegen.blas import gemm_at32
from fusiontune.codegen.microkernel import VECTOR_BITS, Shape, register
from fusiontune.codegen.threading_layer import configure_threading

configure_threading()  # before the parallel functions below are compiled or loaded
UK_SHAPE = Shape("float32", 8, 3) if VECTOR_BITS >= 512 else Shape("float32", 6, 2)
"""The block the peak is measured with: 8x3 (24 accumulators) with 32 vector registers, the block
the packed conv kernels use most there; with 16 (AVX2), where 24 accumulators do not fit, 6x2.
On a Zen 3 core, the two alternated in one process (15 rounds, operands in L1): 8x3 32.4 GFLOP/s,
6x2 69.3 (89.7 at best), 2.24x per round; the peak was sgemm's 62-67 GFLOP/s with 8x3, 92 with
6x2, so the conv table's "% of peak" read above 100% there."""
uk = register(UK_SHAPE)
_MR, _NR = UK_SHAPE.mr, UK_SHAPE.nr


@numba.njit(parallel=True, cache=True, nogil=True)
def parallel_sgemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, chunks: int) -> None:
    """``c = a @ b`` in ``chunks`` row blocks, one single-threaded sgemm per block, in parallel.

    It is how a MatMul kernel runs (codegen/contraction.py): a ``prange`` over row blocks, each
    calling BLAS with one thread (runtime/threads.py). ``a`` (chunks * m, k), ``b`` (k, n) and
    ``c`` (chunks * m, n) are float32 and C-contiguous.
    """
    m = a.shape[0] // chunks
    k = a.shape[1]
    n = b.shape[1]
    for t in numba.prange(chunks):
        gemm_at32(
            m, n, k, a.ctypes.data + t * m * k * 4, k, b.ctypes.data, n,
            c.ctypes.data + t * m * n * 4, n, 0.0,
        )  # fmt: skip


@numba.njit(parallel=True, cache=True, nogil=True)
def parallel_microkernel(a: np.ndarray, b: np.ndarray, c: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                         k: int, calls: int, chunks: int) -> None:
    """``calls`` micro-kernel calls per chunk, in parallel: ``c[t] = a[t]^T b[t]`` for a reduction
    of 9 taps of ``k`` over operands that stay in L1 (the packed conv kernels' inner block).
    ``a`` (chunks, 9 * k * mr), ``b`` (chunks, 9 * k * nr), ``c`` (chunks, mr * nr), float32."""
    mr = _MR
    nr = _NR
    for t in numba.prange(chunks):
        for _ in range(calls):
            uk(k, a[t].ctypes.data, mr, sa.ctypes.data, b[t].ctypes.data, nr, sb.ctypes.data,
               c[t].ctypes.data, nr, 9, 0)
