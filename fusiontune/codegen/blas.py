"""GEMM for generated kernels: scipy's BLAS, bound by symbol name so kernels stay cacheable.

numba's own ``np.dot`` inside a ``prange`` loop reaches BLAS through a ctypes pointer, which numba
refuses to write to its disk cache ("uses dynamic globals"). Here the Fortran ``sgemm``/``dgemm``
of scipy's BLAS are registered with LLVM under fixed symbol names at import and declared as
external functions, so compiled kernels refer to them by name and load from the cache in any
process that imported this module (every generated kernel module does).

Row-major ``out = a @ b`` is computed as the column-major ``out^T = b^T @ a^T``: no copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types
from numba.extending import get_cython_function_address

# Fortran calling convention: every argument by pointer (pointer-sized integers here).
_SIGNATURE = types.void(*([types.intp] * 13))
llvm.add_symbol("fusiontune_sgemm", get_cython_function_address("scipy.linalg.cython_blas", "sgemm"))
llvm.add_symbol("fusiontune_dgemm", get_cython_function_address("scipy.linalg.cython_blas", "dgemm"))
_sgemm = types.ExternalFunction("fusiontune_sgemm", _SIGNATURE)
_dgemm = types.ExternalFunction("fusiontune_dgemm", _SIGNATURE)


def _make(blas: Any, dtype: type, width: int) -> Callable[..., None]:
    @numba.njit(cache=True, nogil=True)
    def gemm(a, b, out):  # type: ignore[no-untyped-def]
        m, k = a.shape
        n = b.shape[1]
        dims = np.empty(6, dtype=np.int32)  # m, n, k, lda, ldb, ldc of the transposed problem
        dims[0] = n
        dims[1] = m
        dims[2] = k
        dims[3] = n
        dims[4] = k
        dims[5] = n
        trans = np.empty(1, dtype=np.uint8)
        trans[0] = 78  # 'N'
        scal = np.empty(2, dtype=dtype)  # alpha = 1, beta = 0
        scal[0] = 1.0
        scal[1] = 0.0
        p = dims.ctypes.data
        t = trans.ctypes.data
        blas(t, t, p, p + 4, p + 8, scal.ctypes.data, b.ctypes.data, p + 12, a.ctypes.data, p + 16,
             scal.ctypes.data + width, out.ctypes.data, p + 20)

    return gemm


gemm32 = _make(_sgemm, np.float32, 4)
gemm64 = _make(_dgemm, np.float64, 8)


def gemm_name(dtype: str) -> str:
    """The gemm a kernel of ``dtype`` calls."""
    return {"float32": "gemm32", "float64": "gemm64"}[dtype]
