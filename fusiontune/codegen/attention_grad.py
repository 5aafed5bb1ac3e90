"""AttentionGrad kernels: Attention's whole backward for one (batch, head) per task, in cache.

For each batch index (q, k, v, dy of one batch shape, flattened), in parallel over the batch:

1. ``S = Q @ K^T`` by one BLAS call, then ``P = softmax(S * scale + mask)`` row by row in place
   (the probabilities are recomputed, as in the flash-attention backward),
2. ``dP = dY @ V^T`` and ``dV = P^T @ dY`` (two BLAS calls),
3. ``dS = P * (dP - rowsum(dP * P)) * scale`` in place of dP,
4. ``dQ = dS @ K`` and ``dK = dS^T @ Q`` (two BLAS calls).

S and dP (Sq x Sk each) live in per-task scratch: the unfused backward writes and reads them
through memory between five MatMul kernels, a softmax kernel and the layout kernels of the
transposes. The BLAS calls are those of codegen/blas.py (single-threaded sgemm / dgemm by symbol
name, called with explicit transposes, so no operand is copied), as in the Attention kernel.

Special values follow the reference: a row of scores that are all ``-inf`` gives NaN (the kernel
subtracts 0 instead of the infinite max, so ``P = 0 * inf``). ``math="approx"`` computes exp with
``exp_approx``; ``precision`` does not apply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fusiontune.codegen.attention import _exp
from fusiontune.codegen.common import (
    ArgSpec,
    KernelSource,
    Lowered,
    NotFusable,
    align,
    decorator,
    kernel_header,
)
from fusiontune.codegen.contraction import _batch_index
from fusiontune.codegen.rules import literal
from fusiontune.ir.ops import get_op

ATTENTION_GRAD_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
"""A hash of this file: kernels inline the GEMM helper, so their cache key quotes it."""

_N, _T = 78, 84  # BLAS 'N' / 'T'


def generate_attention_grad_kernel(
    low: Lowered, inputs: Sequence[str], outputs: Sequence[str], name: str, approx: bool = False
) -> KernelSource:
    """Generate one AttentionGrad node as one kernel (module docstring).

    Args:
        low: the lowered group (one AttentionGrad node).
        inputs: the group's array inputs (q, k, v, dy and a non-scalar mask).
        outputs: the outputs the program reads (a subset of dq, dk, dv; all three are computed).
        name: the kernel function's name.
        approx: exp as ``exp_approx``.

    Raises:
        NotFusable: anything but a lone AttentionGrad node, or mixed / unsupported dtypes.
    """
    if len(low.nodes) != 1 or low.nodes[0].op != "AttentionGrad":
        raise NotFusable("an AttentionGrad node runs as a kernel of its own")
    node = low.nodes[0]
    attrs = {**get_op("AttentionGrad").attrs, **node.attrs}
    q, k, v, dy = node.inputs[:4]
    mask = node.inputs[4] if len(node.inputs) == 5 else None
    vals = low.values
    dtype = vals[q].dtype
    if dtype not in ("float32", "float64") or any(vals[x].dtype != dtype for x in (*node.inputs[:4], *node.outputs)):
        raise NotFusable("AttentionGrad needs float32 or float64 operands of one dtype")
    batch = vals[q].shape[:-2]
    B = int(np.prod(batch)) if batch else 1
    Sq, D = vals[q].shape[-2:]
    Sk, Dv = vals[v].shape[-2:]
    dq, dk, dv = node.outputs
    views = {q: (B, Sq, D), k: (B, Sk, D), v: (B, Sk, Dv), dy: (B, Sq, Dv), dq: (B, Sq, D), dk: (B, Sk, D), dv: (B, Sk, Dv)}
    mask_lit = None
    m_b, mq, mk = "0", 1, 1
    if mask is not None and mask in low.scalars:
        mask_lit = literal(low.scalars[mask], dtype)
        mask = None
    elif mask is not None:
        ms = align(vals[mask].shape, len(batch) + 2)
        bm, m_b = _batch_index(ms, batch)
        mq, mk = ms[-2], ms[-1]
        views[mask] = (bm, mq, mk)
    args = [ArgSpec(x, views[x], vals[x].dtype, "in") for x in inputs]
    # Every gradient is written (a kernel cannot skip one); the ones nobody reads go to scratch.
    args += [ArgSpec(o, views[o], dtype, "out") for o in outputs]
    if {a.value for a in args if a.role == "in"} != {x for x in (q, k, v, dy, mask) if x is not None}:
        raise NotFusable("AttentionGrad operands must be arrays (q, k, v, dy) and one mask")
    an = {a.value: f"a{i}" for i, a in enumerate(args)}
    T = f"np.{dtype}"
    item = np.dtype(dtype).itemsize
    gemm = "gemm32_ex" if dtype == "float32" else "gemm64_ex"
    scale = literal(float(attrs.get("scale", 1.0)), dtype)

    def mask_at(row: str, col: str) -> str:
        if mask_lit is not None:
            return f" + {mask_lit}"
        if mask is None:
            return ""
        r = row if mq != 1 else "0"
        c = col if mk != 1 else "0"
        return f" + {T}({an[mask]}[mbi, {r}, {c}])" if vals[mask].dtype != dtype else f" + {an[mask]}[mbi, {r}, {c}]"

    L: list[str] = [decorator(args, parallel=B > 1), f"def {name}({', '.join(an[a.value] for a in args)}):"]
    e = L.append
    for x in (q, k, v, dy):
        e(f"    p_{an[x]} = {an[x]}.ctypes.data")
    for o in (dq, dk, dv):
        if o in an:
            e(f"    p_{o_name(o, dq, dk)} = {an[o]}.ctypes.data")
        else:
            e(f"    spare_{o_name(o, dq, dk)} = np.empty({views[o]}, dtype={T})")
            e(f"    p_{o_name(o, dq, dk)} = spare_{o_name(o, dq, dk)}.ctypes.data")
    e(f"    for bi in {'numba.prange' if B > 1 else 'range'}({B}):")
    if mask is not None:
        e(f"        mbi = {m_b}")
    e("        ws = np.empty(8, dtype=np.int32)")
    e(f"        sc = np.empty(2, dtype={T})")
    e(f"        s = np.empty(({Sq}, {Sk}), dtype={T})")
    e(f"        dp = np.empty(({Sq}, {Sk}), dtype={T})")
    aq, ak, av, ady = (f"p_{an[x]} + bi * {int(np.prod(views[x][1:])) * item}" for x in (q, k, v, dy))
    odq, odk, odv = (f"p_{n} + bi * {int(np.prod(views[o][1:])) * item}" for n, o in (("dq", dq), ("dk", dk), ("dv", dv)))
    # Row-major X @ Y^T etc. as column-major calls (codegen/blas.py): C^T = op(B)^T @ op(A)^T.
    e(f"        {gemm}(ws, sc, {_T}, {_N}, {Sk}, {Sq}, {D}, {ak}, {D}, {aq}, {D}, 0.0, s.ctypes.data, {Sk})")  # S = Q K^T
    e(f"        for i in range({Sq}):")
    e(f"            mx = {T}(-np.inf)")
    e(f"            for j in range({Sk}):")
    e(f"                x = s[i, j] * {scale}{mask_at('i', 'j')}")
    e("                s[i, j] = x")
    e("                mx = fmaximum(mx, x)")
    e(f"            base = mx if mx != -np.inf else {T}(0.0)")
    e(f"            tot = {T}(0.0)")
    e(f"            for j in range({Sk}):")
    e(f"                p = {_exp('s[i, j] - base', dtype, approx)}")
    e("                s[i, j] = p")
    e("                tot += p")
    e(f"            inv = arith_fence({T}(1.0) / tot)")
    e(f"            for j in range({Sk}):")
    e("                s[i, j] = s[i, j] * inv")
    e(f"        {gemm}(ws, sc, {_T}, {_N}, {Sk}, {Sq}, {Dv}, {av}, {Dv}, {ady}, {Dv}, 0.0, dp.ctypes.data, {Sk})")  # dP = dY V^T
    e(f"        {gemm}(ws, sc, {_N}, {_T}, {Dv}, {Sk}, {Sq}, {ady}, {Dv}, s.ctypes.data, {Sk}, 0.0, {odv}, {Dv})")  # dV = P^T dY
    e(f"        for i in range({Sq}):")
    e(f"            r = {T}(0.0)")
    e(f"            for j in range({Sk}):")
    e("                r += dp[i, j] * s[i, j]")
    e(f"            for j in range({Sk}):")
    e(f"                dp[i, j] = s[i, j] * (dp[i, j] - r) * {scale}")
    e(f"        {gemm}(ws, sc, {_N}, {_N}, {D}, {Sq}, {Sk}, {ak}, {D}, dp.ctypes.data, {Sk}, 0.0, {odq}, {D})")  # dQ = dS K
    e(f"        {gemm}(ws, sc, {_N}, {_T}, {D}, {Sk}, {Sq}, {aq}, {D}, dp.ctypes.data, {Sk}, 0.0, {odk}, {D})")  # dK = dS^T Q
    code = "\n".join(L) + "\n"
    imports = [f"from fusiontune.codegen.blas import {gemm}", f"# fusiontune.codegen.attention_grad version {ATTENTION_GRAD_VERSION}"]
    source = kernel_header(code, imports) + code
    nbytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in args)
    flops = 2 * B * Sq * Sk * (2 * D + 3 * Dv) + 8 * B * Sq * Sk
    return KernelSource(name, source, tuple(args), "attention", nbytes, flops)


def o_name(o: str, dq: str, dk: str) -> str:
    """``dq`` / ``dk`` / ``dv``: the local name of an output's base address."""
    return "dq" if o == dq else "dk" if o == dk else "dv"
