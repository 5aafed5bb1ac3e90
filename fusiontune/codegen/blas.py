"""GEMM for generated kernels: scipy's BLAS, bound by symbol name so kernels stay cacheable.

numba's own ``np.dot`` inside a ``prange`` loop reaches BLAS through a ctypes pointer, which numba
refuses to write to its disk cache ("uses dynamic globals"). Here the Fortran ``sgemm``/``dgemm``
of scipy's BLAS are registered with LLVM under fixed symbol names at import and declared as
external functions, so compiled kernels refer to them by name and load from the cache in any
process that imported this module (every generated kernel module does).

Row-major ``out = a @ b`` is computed as the column-major ``out^T = b^T @ a^T``: no copies.
Four entry points, one call: ``gemm32/64(a, b, out)`` on whole arrays (MatMul kernels),
``gemm_t32/64(a, b, out, ta, tb)`` on row-strided views read transposed (MatMul ``trans_a`` /
``trans_b``),
``gemm_at32/64`` on addresses and row strides (the Conv kernels' strided views), and
``gemm32_ex/64_ex`` with explicit transposes and caller-held scratch (the Attention kernel).
"""

from __future__ import annotations

import ctypes
import functools
import os
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


def _make_ex(blas: Any, dtype: type, width: int) -> Callable[..., None]:
    @numba.njit(cache=True, nogil=True)
    def gemm_ex(ws, sc, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # type: ignore[no-untyped-def]
        """Column-major ``C(m x n) = op(A) @ op(B) + beta * C``; a, b, c are addresses.

        ``ws`` (int32[8]) and ``sc`` (dtype[2]) are the caller's scratch: BLAS takes every
        argument by pointer, and allocating them once per task keeps an inner loop allocation-free.
        ``ta`` / ``tb``: ``78`` ('N') or ``84`` ('T').
        """
        ws[0] = m
        ws[1] = n
        ws[2] = k
        ws[3] = lda
        ws[4] = ldb
        ws[5] = ldc
        ws[6] = ta
        ws[7] = tb
        sc[0] = 1.0
        sc[1] = beta
        p = ws.ctypes.data
        s = sc.ctypes.data
        blas(p + 24, p + 28, p, p + 4, p + 8, s, a, p + 12, b, p + 16, s + width, c, p + 20)

    return gemm_ex


gemm32_ex = _make_ex(_sgemm, np.float32, 4)
gemm64_ex = _make_ex(_dgemm, np.float64, 8)


def _make_at(gemm_ex: Any, dtype: type) -> Callable[..., None]:
    @numba.njit(cache=True, nogil=True)
    def gemm_at(m, n, k, a, lda, b, ldb, c, ldc, beta):  # type: ignore[no-untyped-def]
        """Row-major ``C(m, n) = A(m, k) @ B(k, n) + beta * C`` over addresses and row strides
        (in elements): the column-major ``C^T = B^T @ A^T``, no copies."""
        ws = np.empty(8, dtype=np.int32)
        sc = np.empty(2, dtype=dtype)
        gemm_ex(ws, sc, 78, 78, n, m, k, b, ldb, a, lda, beta, c, ldc)

    return gemm_at


gemm_at32 = _make_at(gemm32_ex, np.float32)
gemm_at64 = _make_at(gemm64_ex, np.float64)


def _make(gemm_at: Any) -> Callable[..., None]:
    @numba.njit(cache=True, nogil=True)
    def gemm(a, b, out):  # type: ignore[no-untyped-def]
        """Row-major ``out = a @ b`` of C-contiguous 2-D arrays."""
        m, k = a.shape
        n = b.shape[1]
        gemm_at(m, n, k, a.ctypes.data, k, b.ctypes.data, n, out.ctypes.data, n, 0.0)

    return gemm


gemm32 = _make(gemm_at32)
gemm64 = _make(gemm_at64)


def _make_t(gemm_ex: Any, dtype: type, width: int) -> Callable[..., None]:
    @numba.njit(cache=True, nogil=True)
    def gemm_t(a, b, out, ta, tb):  # type: ignore[no-untyped-def]
        """Row-major ``out = op(a) @ op(b)``, op a transpose when ``ta`` / ``tb`` is true.

        The arrays are 2-D views whose rows are contiguous (inner stride one element) and whose
        row stride may be anything (a column window of a wider matrix): ``a`` is stored
        ``(k, m)`` when ``ta`` (so a row block of ``op(a)`` is a column window of ``a``), else
        ``(m, k)``; ``b`` is stored ``(n, k)`` when ``tb``, else ``(k, n)``. BLAS reads the
        stored matrices transposed: no copies.
        """
        m, n = out.shape
        k = a.shape[0] if ta else a.shape[1]
        ws = np.empty(8, dtype=np.int32)
        sc = np.empty(2, dtype=dtype)
        lda = a.strides[0] // width
        ldb = b.strides[0] // width
        ldc = out.strides[0] // width
        # Column-major C^T = op(b)^T @ op(a)^T: the stored row-major b is b^T column-major.
        gemm_ex(ws, sc, 84 if tb else 78, 84 if ta else 78, n, m, k,
                b.ctypes.data, ldb, a.ctypes.data, lda, 0.0, out.ctypes.data, ldc)

    return gemm_t


gemm_t32 = _make_t(gemm32_ex, np.float32, 4)
gemm_t64 = _make_t(gemm64_ex, np.float64, 8)


OPENBLAS_AVX512_CORES = frozenset({"SkylakeX", "Cooperlake", "SapphireRapids"})
"""OpenBLAS's kernel families with an AVX-512 sgemm: where scipy's BLAS runs one of them, the MatMul
kernels call it by default instead of the packed micro-kernel path (codegen/contraction.py)."""

_CORENAME_SYMBOLS = ("scipy_openblas_get_corename", "scipy_openblas_get_corename64_", "openblas_get_corename")


@functools.cache
def openblas_core() -> str | None:
    """The kernel family OpenBLAS chose for this CPU (``SkylakeX``, ``Haswell``, ``Zen``...), asked
    of the library that scipy's BLAS functions live in; None when that is not an OpenBLAS this
    process can find (not Linux, another BLAS)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1]}
    except OSError:
        return None
    for path in sorted(paths):
        if not os.path.isfile(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in _CORENAME_SYMBOLS:
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                name = fn()
                return name.decode() if name else None
    return None


def blas_has_avx512() -> bool:
    """Whether scipy's BLAS runs an AVX-512 sgemm (:data:`OPENBLAS_AVX512_CORES`)."""
    return openblas_core() in OPENBLAS_AVX512_CORES


def gemm_name(dtype: str, transposed: bool = False) -> str:
    """The gemm a kernel of ``dtype`` calls (``gemm_t*`` when an operand is read transposed)."""
    if transposed:
        return {"float32": "gemm_t32", "float64": "gemm_t64"}[dtype]
    return {"float32": "gemm32", "float64": "gemm64"}[dtype]
