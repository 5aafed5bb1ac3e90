"""Window kernels: MaxPool and AveragePool (ONNX semantics, NCHW, 1-D and 2-D), one node each.

The tasks of a ``prange`` take (image, channel) planes; an input is read only where the window
lies inside it (the padding is never read).

* MaxPool: separable. Over a narrow plane (:data:`POOL_FLAT_MAX_WIDTH`), the max over the
  window's columns, then over its rows, each as one flat loop over the whole (padded) plane, and
  each output read at its window's corner. Over a wide one, per output row, the max over the
  window's input rows (contiguous loads, vectorized at any stride) into a row between -inf pads,
  then per output the max over the window's columns of that row. ``fmaximum`` (codegen/numerics.py) is exact and order-free and
  propagates NaN as ``np.max`` does; -inf (padding) never wins. Dilations are honoured. 8x32x64x64
  3x3 s2: 1.78 ms -> 0.57 ms on one core (the row-per-task kernel allocated a row per task and
  read the input with stride-2 gathers).
* AveragePool: per output row, the taps summed in window order (kh, then kw); the sum of the
  real elements divided by the count, which is separable: the taps of a window row that fall inside ``[0, H)`` (``count_include_pad=0``) or inside the explicitly
  padded ``[-pad_begin, H + pad_end)`` (``count_include_pad=1``; a ceil_mode overhang never
  counts) times those of its column.
"""

from __future__ import annotations

import numpy as np

from fusiontune.codegen._window import Window, col_range, window_of
from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    NotFusable,
    decorator,
    kernel_header,
    task_threads,
)
from fusiontune.codegen.rules import WINDOW_OPS
from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import get_op

POOL_FLAT_MAX_WIDTH = 48
"""A MaxPool whose padded rows are narrower than this runs over flat planes (:func:`_max_lines`),
a wider one row by row (:func:`_max_row_lines`). Measured, 3x3 s2 (us, row by row / flat, 1 and
2 threads): 2x64 @31x31 69 / 36 and 37 / 19; 2x128 @7x7 24 / 11 and 24 / 11; but 8x32 @64x64
pads 1 340 / 340 and 129 / 166, 64 @112x112 186 / 247 and 118 / 128: a wide row fills its
vectors, and the flat pass computes every row's vertical max, not only the output rows'."""


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
    parallel = win.n * win.c * win.oh * win.ow * win.kh * win.kw >= PARALLEL_MIN_ELEMENTS
    prange = "numba.prange" if parallel else "range"
    is_max = node.op == "MaxPool"
    lines = [
        decorator(args, parallel=parallel, reassoc=False),
        f"def {name}(a0, a1):",
        # Row widths read from the arrays at run time: LLVM fully unrolls a loop of a small
        # constant trip count before its loop vectorizer runs (numba leaves SLP off), so a
        # 31-wide row ran scalar.
        "    w_n = a0.shape[3]",
        "    ow_n = a1.shape[3]",
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
    if is_max and win.wp >= POOL_FLAT_MAX_WIDTH:
        lines += _max_row_lines(win, dt, prange)
    elif is_max:
        lines += _max_lines(win, dt, prange, task_threads(parallel))
    else:
        lines += _average_lines(win, dt, prange)
    code = "\n".join(lines) + "\n"
    source = kernel_header(code) + code
    nbytes = (x.size + y.size) * np.dtype(dt).itemsize
    flops = y.size * win.kh * win.kw
    return KernelSource(name, source, args, "window", nbytes, flops)


def _max_row_lines(win: Window, dt: str, prange: str) -> list[str]:
    """MaxPool of wide planes (at least :data:`POOL_FLAT_MAX_WIDTH`), separably: per output row, ``vm`` = the max over the window's rows of the input
    rows (contiguous loads, vectorized at any stride), stored between -inf column pads; then each
    output is the max of ``vm`` over the window's columns, read without bounds checks. ``fmaximum``
    is exact, associative and commutative (NaN if any input is NaN, -0 < +0) and -inf never wins,
    so this is the same value as the max over the window's elements inside the input."""
    width = win.wp
    expr = f"vm[ow * {win.sw}]"
    for kw in range(1, win.kw):
        expr = f"fmaximum({expr}, vm[ow * {win.sw} + {kw * win.dw}])"
    return [
        f"    for t in {prange}({win.n * win.c}):",
        f"        c = t % {win.c}",
        f"        n = t // {win.c}",
        f"        vm = np.full({width}, np.{dt}(-np.inf))",
        f"        for oh in range({win.oh}):",
        f"            for u in range({win.pw}, {win.pw + win.w}):",
        f"                vm[u] = np.{dt}(-np.inf)",
        f"            for kh in range({win.kh}):",
        f"                ih = oh * {win.sh} - {win.ph} + kh * {win.dh}",
        f"                if ih < 0 or ih >= {win.h}:",
        "                    continue",
        "                for u in range(w_n):",
        f"                    vm[u + {win.pw}] = fmaximum(vm[u + {win.pw}], a0[n, c, ih, u])",
        "            for ow in range(ow_n):",
        f"                a1[n, c, oh, ow] = {expr}",
    ]


def _max_lines(win: Window, dt: str, prange: str, threads: int) -> list[str]:
    """MaxPool of narrow planes, separably, over each (image, channel) plane as flat runs: the plane is copied
    into a ``wp``-wide scratch plane between -inf pads (unless the windows never leave the input:
    then the input plane itself is read); ``hm[i]`` = the max over the window's columns of
    ``xp[i + kw * dw]`` and ``vm[i]`` = the max over its rows of ``hm[i + kh * dh * wp]``, each
    one flat loop over the whole plane, vectorized however narrow the rows are; each output
    then reads ``vm`` at its window's corner. Row by row, the loops of a 31-wide plane ran 16
    lanes and 15 scalar remainders per row (SqueezeNet's 3x3 s2 pools: 17 us serial for 32
    planes of 31x31). ``fmaximum`` is exact, associative and commutative (NaN if any input is
    NaN, -0 < +0) and -inf never wins, so this is the max over the window's elements inside the
    input."""
    hp, wp = win.hp, win.wp
    inside = win.ph == win.pw == 0 and hp == win.h and wp == win.w
    nh = hp * wp - (win.kw - 1) * win.dw  # hm's flat length
    nv = ((win.oh - 1) * win.sh) * wp + (win.ow - 1) * win.sw + 1  # vm's: to the last output's corner
    hexpr = "xp[numba.uint64(i)]"
    for kw in range(1, win.kw):
        hexpr = f"fmaximum({hexpr}, xp[numba.uint64(i + {kw * win.dw})])"
    vexpr = "hm[numba.uint64(i)]"
    for kh in range(1, win.kh):
        vexpr = f"fmaximum({vexpr}, hm[numba.uint64(i + {kh * win.dh * wp})])"
    # Planes are dealt to tasks in runs (two runs per thread), and a task allocates its scratch
    # once: 128 planes of 7x7, allocated per plane, took 9.6 us.
    units = win.n * win.c
    per = -(-units // (2 * threads))
    lines = [
        f"    for t in {prange}({-(-units // per)}):",
        f"        hm = np.empty({nh}, dtype=np.{dt})",
        f"        vm = np.empty({nv}, dtype=np.{dt})",
    ]
    if not inside:
        # the -inf borders are written once per task; each plane overwrites only the interior
        lines.append(f"        xq = np.full({hp * wp}, np.{dt}(-np.inf))")
    lines += [
        f"        for v in range(t * {per}, min((t + 1) * {per}, {units})):",
        f"            c = v % {win.c}",
        f"            n = v // {win.c}",
    ]
    if inside:
        lines.append(f"            xp = a0[n, c].reshape({hp * wp})")
    else:
        lines += [
            "            xp = xq",
            f"            for ih in range({win.h}):",
            f"                r = (ih + {win.ph}) * {wp} + {win.pw}",
            "                xi = a0[n, c, ih]",
            "                for u in range(w_n):",
            "                    xp[numba.uint64(r + u)] = xi[u]",
        ]
    lines += [
        f"            for i in range({nh}):",
        f"                hm[i] = {hexpr}",
        f"            for i in range({nv}):",
        f"                vm[i] = {vexpr}",
        f"            for oh in range({win.oh}):",
        f"                r = oh * {win.sh * wp}",
        "                for ow in range(ow_n):",
        f"                    a1[n, c, oh, ow] = vm[r + ow * {win.sw}]",
    ]
    return lines


def _average_lines(win: Window, dt: str, prange: str) -> list[str]:
    """AveragePool: per output row, the taps summed in window order (kh, then kw) into a row
    accumulator, divided by the count; one task per (image, channel) reuses its row."""
    return [
        f"    for t in {prange}({win.n * win.c}):",
        f"        c = t % {win.c}",
        f"        n = t // {win.c}",
        f"        row = np.empty({win.ow}, dtype=np.{dt})",
        f"        for oh in range({win.oh}):",
        f"            for ow in range({win.ow}):",
        "                row[ow] = 0.0",
        f"            for kh in range({win.kh}):",
        f"                ih = oh * {win.sh} - {win.ph} + kh * {win.dh}",
        f"                if ih < 0 or ih >= {win.h}:",
        "                    continue",
        f"                for kw in range({win.kw}):",
        *col_range(win, "                    "),
        "                    for ow in range(lo, hi):",
        f"                        row[ow] = row[ow] + a0[n, c, ih, ow * {win.sw} + off]",
        "            for ow in range(ow_n):",
        "                a1[n, c, oh, ow] = row[ow] / (cnt_h[oh] * cnt_w[ow])",
    ]
