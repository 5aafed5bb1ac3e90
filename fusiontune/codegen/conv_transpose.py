"""ConvTranspose kernels (ONNX ConvTranspose, NCHW, 1-D and 2-D): one BLAS GEMM per block of
output channels and input rows, then a col2im scatter-add into the output planes.

For image ``n`` and group ``g``, ``cols = W_g^T @ X_g`` holds, for every output channel ``m``,
tap ``(kh, kw)`` and input position ``(ih, iw)``, the product summed over the group's input
channels; each such entry lands on output position ``(ih * sh + kh * dh - ph, iw * sw + kw * dw -
pw)`` (the definition of ConvTranspose). A ``prange`` task owns ``MB`` output channels of one
(image, group): it fills their planes with the bias (or zeros), then walks the input in blocks of
``RB`` rows: one GEMM (codegen/blas.py, the weight read transposed in place, no copy) writes the
block's ``MB * kh * kw`` rows of ``cols`` into a scratch matrix sized to stay in L2
(:data:`COL_BYTES`), and the scatter-add runs over it while it is in cache. A task owns its output
planes whole, so no two tasks write the same element and the sums need no atomics. ``MB`` is cut
so that there are at least as many tasks as threads when the (image, group) count alone is lower.

A 1-D op (N, C, L) runs as a 2-D one with H = 1 (the runtime passes every buffer reshaped to the
4-D view the kernel declares). The bias is added in the kernel; other epilogues are not fused
(the group holds the ConvTranspose alone).
"""

from __future__ import annotations

import numba
import numpy as np

from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    NotFusable,
    decorator,
    kernel_header,
)
from fusiontune.ir._ops_index import conv_transpose_attrs
from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import get_op

COL_BYTES = 512 * 1024
"""Target size of a task's ``cols`` block: well inside a 2 MiB L2 per core (as codegen/conv.py)."""


def generate_conv_transpose_kernel(node: Node, values: dict[str, Value], name: str) -> KernelSource:
    """One kernel for a ConvTranspose node (bias included).

    Raises:
        NotFusable: another op, a 3-D ConvTranspose, or operands that are not float32 / float64 of
            one dtype.
    """
    if node.op != "ConvTranspose":
        raise NotFusable(f"{node.op} is not a ConvTranspose")
    x, w, y = values[node.inputs[0]], values[node.inputs[1]], values[node.outputs[0]]
    bias = values[node.inputs[2]] if len(node.inputs) == 3 else None
    dt = y.dtype
    if dt not in ("float32", "float64") or any(v.dtype != dt for v in (x, w, *([bias] if bias else []))):
        raise NotFusable("ConvTranspose needs float32 or float64 operands of one dtype")
    spatial = len(x.shape) - 2
    if spatial not in (1, 2):
        raise NotFusable(f"{spatial}-D ConvTranspose has no kernel (1-D and 2-D only)")
    attrs = {**get_op("ConvTranspose").attrs, **node.attrs}
    strides, pads, dil, _ = conv_transpose_attrs(attrs, spatial)
    n, c = x.shape[:2]
    group = int(attrs.get("group", 1))
    cg, mg = c // group, w.shape[1]
    m = mg * group
    if spatial == 1:
        h, wd, kh, kw, oh, ow = 1, x.shape[2], 1, w.shape[2], 1, y.shape[2]
        sh, sw, ph, pw, dh, dw = 1, strides[0], 0, pads[0], 1, dil[0]
    else:
        h, wd, kh, kw, oh, ow = x.shape[2], x.shape[3], w.shape[2], w.shape[3], y.shape[2], y.shape[3]
        (sh, sw), (ph, pw), (dh, dw) = strides, pads[:2], dil
    kk, hw = kh * kw, h * wd
    item = np.dtype(dt).itemsize
    args = [
        ArgSpec(x.name, (n, c, h, wd), dt, "in"),
        ArgSpec(w.name, (c, mg, kh, kw), dt, "in"),
        *([ArgSpec(bias.name, (m,), dt, "in")] if bias else []),
        ArgSpec(y.name, (n, m, oh, ow), dt, "out"),
    ]
    yarg = f"a{len(args) - 1}"
    flops = 2 * n * c * mg * kk * hw
    parallel = flops >= PARALLEL_MIN_ELEMENTS * 8
    # Output channels per task: all of the group's, or fewer when (image, group) tasks alone would
    # leave threads idle; never so many that one input row of cols outgrows COL_BYTES.
    threads = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # a literal: see contraction.py
    want = -(-threads // (n * group)) if parallel else 1
    mb = max(1, min(-(-mg // want), COL_BYTES // max(kk * wd * item, 1)))
    nmb = -(-mg // mb)
    rb = max(1, min(h, COL_BYTES // max(mb * kk * wd * item, 1)))
    gemm = "gemm32_ex" if dt == "float32" else "gemm64_ex"
    T = f"np.{dt}"
    L = [decorator(args, parallel=parallel, reassoc=False), f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}):"]
    e = L.append
    e("    xp = a0.ctypes.data")
    e("    wp = a1.ctypes.data")
    e(f"    for t in {'numba.prange' if parallel else 'range'}({n * group * nmb}):")
    e(f"        img = t // {group * nmb}")
    e(f"        g = (t // {nmb}) % {group}")
    e(f"        m0 = (t % {nmb}) * {mb}")
    e(f"        nm = min({mb}, {mg} - m0)")
    e("        for j in range(nm):")
    e(f"            oc = g * {mg} + m0 + j")
    e(f"            v = {'a2[oc]' if bias else f'{T}(0.0)'}")
    e(f"            for r in range({oh}):")
    e(f"                for q in range({ow}):")
    e(f"                    {yarg}[img, oc, r, q] = v")
    e(f"        cols = np.empty({mb * kk * rb * wd}, dtype={T})")
    e("        ws = np.empty(8, dtype=np.int32)")
    e(f"        sc = np.empty(2, dtype={T})")
    e(f"        for r0 in range(0, {h}, {rb}):")
    e(f"            nr = min({rb}, {h} - r0)")
    e(f"            nb = nr * {wd}")
    # column-major cols^T (nb x nm*kk) = X_blk^T (nb x cg, as stored) @ W_blk (cg x nm*kk: the
    # stored (nm*kk x cg) column-major block, transposed); row-major cols is (nm*kk, nb).
    e(f"            xa = xp + ((img * {c} + g * {cg}) * {hw} + r0 * {wd}) * {item}")
    e(f"            wa = wp + (g * {cg * mg * kk} + m0 * {kk}) * {item}")
    e(f"            {gemm}(ws, sc, 78, 84, nb, nm * {kk}, {cg}, xa, {hw}, wa, {mg * kk}, 0.0, cols.ctypes.data, nb)")
    e("            for j in range(nm):")
    e(f"                oc = g * {mg} + m0 + j")
    e(f"                for u in range({kh}):")
    e("                    for ih in range(r0, r0 + nr):")
    e(f"                        orow = ih * {sh} + u * {dh} - {ph}")
    e(f"                        if orow < 0 or orow >= {oh}:")
    e("                            continue")
    e(f"                        for p in range({kw}):")
    e(f"                            off = p * {dw} - {pw}")
    e(f"                            lo = 0 if off >= 0 else (-off + {sw - 1}) // {sw}")
    e(f"                            hi = ({ow - 1} - off) // {sw} + 1 if off <= {ow - 1} else 0")
    e(f"                            hi = min(hi, {wd})")
    e(f"                            base = ((j * {kh} + u) * {kw} + p) * nb + (ih - r0) * {wd}")
    e("                            for iw in range(lo, hi):")
    e(f"                                {yarg}[img, oc, orow, iw * {sw} + off] += cols[base + iw]")
    code = "\n".join(L) + "\n"
    source = kernel_header(code, [f"from fusiontune.codegen.blas import {gemm}"]) + code
    nbytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in args)
    return KernelSource(name, source, tuple(args), "contraction", nbytes, flops)
