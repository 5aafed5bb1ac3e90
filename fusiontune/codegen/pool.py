"""Window kernels: MaxPool and AveragePool (ONNX semantics, NCHW, 1-D and 2-D), one node each.

One ``prange`` task per (image, channel, output row) keeps a row accumulator; for each window tap
(kh, kw) the inner loop runs over the output row, reading input column ``ow * sw + off`` only
where it lies inside the input (the padding is never read). At stride 1 the loads are contiguous
and LLVM vectorizes the loop.

* MaxPool: the accumulator starts at -inf (padding never wins) and takes ``fmaximum``
  (codegen/numerics.py), which propagates NaN as ``np.max`` does. Dilations are honoured.
* AveragePool: the sum of the real elements divided by the count, which is separable: the taps
  of a window row that fall inside ``[0, H)`` (``count_include_pad=0``) or inside the explicitly
  padded ``[-pad_begin, H + pad_end)`` (``count_include_pad=1``; a ceil_mode overhang never
  counts) times those of its column.
"""

from __future__ import annotations

import numpy as np

from fusiontune.codegen._window import col_range, window_of
from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    NotFusable,
    decorator,
    kernel_header,
)
from fusiontune.codegen.rules import WINDOW_OPS
from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import get_op


def _counts(size: int, out: int, k: int, s: int, pad: int, d: int, lo: int, hi: int) -> list[int]:
    """Per output index, the window taps whose input index lies in ``[lo, hi)``."""
    return [sum(1 for t in range(k) if lo <= o * s - pad + t * d < hi) for o in range(out)]


def generate_pool_kernel(node: Node, values: dict[str, Value], name: str) -> KernelSource:
    """One kernel for a MaxPool or AveragePool node.

    Raises:
        NotFusable: another op, a 3-D pool, or a dtype other than float32 / float64.
    """
    if node.op not in WINDOW_OPS:
        raise NotFusable(f"{node.op} is not a window op")
    x, y = values[node.inputs[0]], values[node.outputs[0]]
    if x.dtype not in ("float32", "float64"):
        raise NotFusable(f"{node.op} needs float32 or float64 input, got {x.dtype}")
    attrs = {**get_op(node.op).attrs, **node.attrs}
    win = window_of(attrs, x.shape, tuple(attrs["kernel_shape"]), y.shape)
    dt = x.dtype
    args = (
        ArgSpec(x.name, (win.n, win.c, win.h, win.w), dt, "in"),
        ArgSpec(y.name, (win.n, win.c, win.oh, win.ow), dt, "out"),
    )
    tasks = win.n * win.c * win.oh
    parallel = tasks * win.ow * win.kh * win.kw >= PARALLEL_MIN_ELEMENTS
    prange = "numba.prange" if parallel else "range"
    is_max = node.op == "MaxPool"
    init = "-np.inf" if is_max else "0.0"
    lines = [
        decorator(args, parallel=parallel, reassoc=False),
        f"def {name}(a0, a1):",
    ]
    if not is_max:
        if attrs.get("count_include_pad", 0):
            bounds_h, bounds_w = (-win.ph, win.h + win.pe_h), (-win.pw, win.w + win.pe_w)
        else:
            bounds_h, bounds_w = (0, win.h), (0, win.w)
        ch = _counts(win.h, win.oh, win.kh, win.sh, win.ph, win.dh, *bounds_h)
        cw = _counts(win.w, win.ow, win.kw, win.sw, win.pw, win.dw, *bounds_w)
        lines.append(f"    cnt_h = np.array({ch!r}, dtype=np.{dt})")
        lines.append(f"    cnt_w = np.array({cw!r}, dtype=np.{dt})")
    lines += [
        f"    for t in {prange}({tasks}):",
        f"        oh = t % {win.oh}",
        f"        c = (t // {win.oh}) % {win.c}",
        f"        n = t // {win.oh * win.c}",
        f"        row = np.full({win.ow}, np.{dt}({init}))",
        f"        for kh in range({win.kh}):",
        f"            ih = oh * {win.sh} - {win.ph} + kh * {win.dh}",
        f"            if ih < 0 or ih >= {win.h}:",
        "                continue",
        f"            for kw in range({win.kw}):",
        *col_range(win, "                "),
        "                for ow in range(lo, hi):",
    ]
    read = f"a0[n, c, ih, ow * {win.sw} + off]"
    lines.append(f"                    row[ow] = {'fmaximum(row[ow], ' + read + ')' if is_max else 'row[ow] + ' + read}")
    if is_max:
        lines += [f"        for ow in range({win.ow}):", "            a1[n, c, oh, ow] = row[ow]"]
    else:
        lines += [f"        for ow in range({win.ow}):", "            a1[n, c, oh, ow] = row[ow] / (cnt_h[oh] * cnt_w[ow])"]
    code = "\n".join(lines) + "\n"
    source = kernel_header(code) + code
    nbytes = (x.size + y.size) * np.dtype(dt).itemsize
    flops = y.size * win.kh * win.kw
    return KernelSource(name, source, args, "window", nbytes, flops)
