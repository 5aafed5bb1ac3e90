"""The sgemm that the float32 FLOP peak is measured with (imported lazily: it loads numba and BLAS).

A module of its own so that numba can cache the compiled function on disk: it calls the BLAS
binding of the generated kernels (:mod:`fusiontune.codegen.blas`) by symbol name, as they do.
"""

from __future__ import annotations

import numba
import numpy as np

from fusiontune.codegen.blas import gemm_at32
from fusiontune.codegen.threading_layer import configure_threading

configure_threading()  # before the parallel function below is compiled or loaded


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
