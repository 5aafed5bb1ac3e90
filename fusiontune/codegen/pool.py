"""Window kernels: MaxPool and AveragePool (ONNX semantics, NCHW, 1-D and 2-D), one node each.

The tasks of a ``prange`` take (image, channel) planes; an input is read only where the window
lies inside it (the padding is never read).

* MaxPool: three kernels (:func:`max_pool_algo` picks). ``phase``: a strided window over phase
  planes, every tap one flat unit-stride run over a batch of planes (:func:`_phase_lines`).
  ``flat``: separable over a narrow plane (:data:`POOL_FLAT_MAX_WIDTH`), the max over the
  window's columns, then over its rows, each as one flat loop over the whole (padded) plane (over
  all of a task's planes at once when the windows stay inside the input), and each output read at
  its window's corner. ``row``: over a wide plane, per output row, the max
  over the window's input rows (contiguous loads, vectorized at any stride) into a row between
  -inf pads, then per output the max over the window's columns of that row. The max of a window
  is :func:`max_of`'s compare-and-selects with one NaN test (NaN wherever a NaN is, as
  ``np.max``); -inf (padding) never wins. Dilations are honoured. 8x32x64x64 3x3 s2: 1.78 ms ->
  0.57 ms on one core (the row-per-task kernel allocated a row per task and read the input with
  stride-2 gathers).
* AveragePool (:func:`average_pool_algo` picks): strided, over a task's planes in place or over
  phase planes with zero pads (as MaxPool's ``flat`` and ``phase``); else per output row. Every
  way the taps summed in window order (kh, then kw); the sum of the
  real elements divided by the count, which is separable: the taps of a window row that fall inside ``[0, H)`` (``count_include_pad=0``) or inside the explicitly
  padded ``[-pad_begin, H + pad_end)`` (``count_include_pad=1``; a ceil_mode overhang never
  counts) times those of its column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusiontune.codegen._window import Window, col_range, phase_copy, window_of
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


MAX_POOL_ALGOS = ("flat", "row", "phase")
POOL_SCRATCH_ELEMENTS = 4096
"""The phase kernel's scratch per batch of planes, in elements (16 KiB of float32, which stays in
the L1 cache with the batch's input): planes are batched up to it. From 16384 to 4096 (one
Emerald Rapids thread, us): ResNet18's 2x64 @32 3x3 s2 pad 1 51.5 -> 34.8, DenseNet's 2x2 s2 128
@56 average 157.6 -> 101.1; 2048 was no faster."""


POOL_PHASE_MAX_TAPS = 49
"""The phase kernel writes a window's taps as one expression: up to 7x7 of them."""


def phase_applies(win: Window) -> bool:
    """Whether the phase kernel (:func:`_phase_lines`) takes ``win``: a strided window of at most
    :data:`POOL_PHASE_MAX_TAPS` taps."""
    return (win.sh, win.sw) != (1, 1) and win.kh * win.kw <= POOL_PHASE_MAX_TAPS


def max_pool_algo(win: Window) -> str:
    """The MaxPool kernel for ``win``: ``phase`` (:func:`_phase_lines`) for a strided window that
    leaves the input (pads, or a ceil_mode overhang); else ``row`` (:func:`_max_row_lines`) over
    rows of at least :data:`POOL_FLAT_MAX_WIDTH`, ``flat`` (:func:`_max_lines`) over narrower
    ones. Measured (``benchmarks/bench_conv.py --only pools``, one thread, us; flat / row /
    phase): 3x3 s2 pad 1 2x64 @32 31.8 / 53.6 / 23.0 and 64 @112 216.3 / 145.8 / 104.5; without
    pads, 3x3 s2 ceil_mode 2x64 @31 28.9 / 44.6 / 28.6, 2x128 @15 12.7 / 36.0 / 20.6, 2x256 @7
    5.2 / 25.1 / 13.8, 2x2 s2 64 @64 48.6 / 17.7 / 38.8: where the windows can read the input in
    place, a copy into phase planes costs more than it saves.

    Tried and not kept (2026-12-07, Zen 3, AVX2, one thread): a plane at a time in LLVM IR, each
    output row in masked vectors, the window's taps unrolled as masked loads of the input rows
    (-inf in the lanes outside them), stride 2 as the even lanes of two loads. Nothing is computed
    that is not an output, yet every tap of every output vector is two masked loads, a blend and
    a cross-lane shuffle: 1.6x to 3.3x slower than the kernel this rule picks on every MaxPool of
    ``bench_conv.py --only pools`` (SqueezeNet's export 2x16 @31 25.5 against flat's 13.7 us)."""
    if phase_applies(win) and not _inside(win):
        return "phase"
    return "row" if win.wp >= POOL_FLAT_MAX_WIDTH else "flat"


def max_of(terms: list[str], dt: str) -> str:
    """The max of ``terms``, NaN if any is NaN: a tree of compare-and-selects (``max``) and one
    NaN test over all of them, 2 vector instructions a term where the IEEE maximum of
    codegen/numerics.py's ``fmaximum`` takes 6 (its NaN and signed-zero fix-ups, per pair; a 3x3
    s2 pool of 2x64 @31 took 31.0 us with it, 22.9 with this). The value is the window's max
    whatever the order (for -0 against +0 either zero, as numpy's own max)."""
    if len(terms) == 1:
        return terms[0]
    level = list(terms)
    while len(level) > 1:  # a balanced tree: nesting depth log2(taps), not one per tap
        level = [f"max({level[i]}, {level[i + 1]})" if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    expr = level[0]
    ok = " & ".join(f"({t} == {t})" for t in terms)
    return f"({expr} if {ok} else np.{dt}(np.nan))"


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
    threads = task_threads(parallel)
    algo = max_pool_algo(win) if is_max else average_pool_algo(win)
    if algo == "phase":
        lines += _phase_lines(win, dt, prange, threads, average=not is_max)
    elif is_max and algo == "row":
        lines += _max_row_lines(win, dt, prange)
    elif is_max:
        lines += _max_lines(win, dt, prange, threads)
    elif algo == "flat" and _inside(win):
        lines += _average_run_lines(win, dt, prange, -(-win.n * win.c // (2 * threads)))
    else:
        lines += _average_lines(win, dt, prange)
    code = "\n".join(lines) + "\n"
    source = kernel_header(code, _gather_imports(code, dt)) + code
    nbytes = (x.size + y.size) * np.dtype(dt).itemsize
    flops = y.size * win.kh * win.kw
    return KernelSource(name, source, args, "window", nbytes, flops)


def _max_row_lines(win: Window, dt: str, prange: str) -> list[str]:
    """MaxPool of wide planes (at least :data:`POOL_FLAT_MAX_WIDTH`), separably: per output row, ``vm`` = the max over the window's rows of the input
    rows (contiguous loads, vectorized at any stride), stored between -inf column pads; then each
    output is the max of ``vm`` over the window's columns, read without bounds checks. A max is
    exact and order-free but for the sign of a zero (NaN if any input is NaN: :func:`max_of`) and
    -inf never wins, so this is the max over the window's elements inside the input."""
    width = win.wp
    expr = max_of([f"vm[ow * {win.sw} + {kw * win.dw}]" for kw in range(win.kw)], dt)
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
        f"                    vm[u + {win.pw}] = {max_of([f'vm[u + {win.pw}]', 'a0[n, c, ih, u]'], dt)}",
        "            for ow in range(ow_n):",
        f"                a1[n, c, oh, ow] = {expr}",
    ]


def _max_lines(win: Window, dt: str, prange: str, threads: int) -> list[str]:
    """MaxPool of narrow planes, separably, over each (image, channel) plane as flat runs: the plane is copied
    into a ``wp``-wide scratch plane between -inf pads (where the windows never leave the input,
    :func:`_max_run_lines` reads the input in place instead); ``hm[i]`` = the max over the window's columns of
    ``xp[i + kw * dw]`` and ``vm[i]`` = the max over its rows of ``hm[i + kh * dh * wp]``, each
    one flat loop over the whole plane, vectorized however narrow the rows are; each output
    then reads ``vm`` at its window's corner. Row by row, the loops of a 31-wide plane ran 16
    lanes and 15 scalar remainders per row (SqueezeNet's 3x3 s2 pools: 17 us serial for 32
    planes of 31x31). As in :func:`_max_row_lines`, this is the max over the window's elements
    inside the input."""
    hp, wp = win.hp, win.wp
    nh = hp * wp - (win.kw - 1) * win.dw  # hm's flat length
    nv = ((win.oh - 1) * win.sh) * wp + (win.ow - 1) * win.sw + 1  # vm's: to the last output's corner
    hexpr = max_of([f"xp[numba.uint64(i + {kw * win.dw})]" for kw in range(win.kw)], dt)
    vexpr = max_of([f"hm[numba.uint64(i + {kh * win.dh * wp})]" for kh in range(win.kh)], dt)
    # Planes are dealt to tasks in runs (two runs per thread), and a task allocates its scratch
    # once: 128 planes of 7x7, allocated per plane, took 9.6 us.
    units = win.n * win.c
    per = -(-units // (2 * threads))
    if _inside(win):
        return _max_run_lines(win, dt, prange, per)
    lines = [
        f"    for t in {prange}({-(-units // per)}):",
        f"        hm = np.empty({nh}, dtype=np.{dt})",
        f"        vm = np.empty({nv}, dtype=np.{dt})",
        # the -inf borders are written once per task; each plane overwrites only the interior
        f"        xq = np.full({hp * wp}, np.{dt}(-np.inf))",
        f"        for v in range(t * {per}, min((t + 1) * {per}, {units})):",
        f"            c = v % {win.c}",
        f"            n = v // {win.c}",
        "            xp = xq",
        # the row loops around a vectorized loop count from the arrays' shapes, not literals: LLVM
        # unrolls a literal count whole, copies of the vector loop that run no faster and took
        # seconds to compile (ShuffleNet's 3x3 s2 average pool: 8 s, 2.3 s without)
        "            for ih in range(a0.shape[2]):",
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
    ]
    lines += _gather_outputs(win, dt, "vm.ctypes.data", win.sh * wp, win.sw, "v", "            ") or [
        "            for oh in range(a1.shape[2]):",
        f"                r = oh * {win.sh * wp}",
        "                for ow in range(ow_n):",
        f"                    a1[n, c, oh, ow] = vm[r + ow * {win.sw}]",
    ]
    return lines


GATHER_MIN_WIDTH = 7
"""Output rows at least this wide are copied out of a pool's scratch by
:func:`~fusiontune.codegen.microkernel.rows_copy` (masked vectors; at stride 2 two-register
shuffles), narrower ones by numba's loop, which reads the corners one at a time. One thread, a
MaxPool kernel alone against the same kernel with the loop, interleaved (batch 2, 3x3 s2,
ceil_mode): 16 @31 (15-wide rows) 1.38x, 32 @15 (7) 1.15x, 64 @7 (3) 0.97x; 64 @31 1.69x."""


def _gather_outputs(win: Window, dt: str, src: str, lds: int, step: int, plane: str, indent: str) -> list[str]:
    """Statements that write plane ``plane`` (its flat index ``n * C + c``) of the output from the
    scratch run at address ``src`` whose output row ``oh`` starts ``oh * lds`` elements in, output
    ``ow`` at ``ow * step`` (1 or 2) from there, as one call of ``rg<step>``
    (:func:`~fusiontune.codegen.microkernel.rows_copy`, imported by :func:`_gather_imports`);
    empty where that does not apply (rows narrower than :data:`GATHER_MIN_WIDTH`, another step,
    a dtype other than float32 and float64)."""
    if step not in (1, 2) or dt not in ("float32", "float64") or win.ow < GATHER_MIN_WIDTH:
        return []
    isz = np.dtype(dt).itemsize
    return [f"{indent}rg{step}({win.oh}, ow_n, {src}, {lds}, a1.ctypes.data + {plane} * {win.oh * win.ow * isz}, ow_n)"]


def _gather_imports(code: str, dt: str) -> list[str]:
    """The imports of the ``rg<step>`` that ``code`` calls (:func:`_gather_outputs`)."""
    steps = [step for step in (1, 2) if f"rg{step}(" in code]
    if not steps:
        return []
    return ["from fusiontune.codegen.microkernel import rows_copy", *(f"rg{k} = rows_copy({dt!r}, {k})" for k in steps)]


def _max_run_lines(win: Window, dt: str, prange: str, per: int) -> list[str]:
    """:func:`_max_lines` where the windows never leave the input: a task's planes follow one
    another in the input, so its ``hm`` and ``vm`` are each one flat loop over a chunk of them
    (:func:`_chunk`; the positions whose window crosses into the next plane are computed and never
    read: every output's window lies inside its own plane). Per plane, the loops of a 7x7 plane
    were shorter than one vector."""
    w = win.w
    reach_h = (win.kw - 1) * win.dw  # hm's last position's reach past it
    reach_v = (win.kh - 1) * win.dh * w
    hexpr = max_of([f"xf[{_ix(f'b + i + {kw * win.dw}')}]" for kw in range(win.kw)], dt)
    vexpr = max_of([f"hm[{_ix(f'i + {kh * win.dh * w}')}]" for kh in range(win.kh)], dt)
    return [
        *_chunk_loop(win, dt, prange, per, ("hm", "vm")),
        f"            for i in range(run - {reach_h}):",
        f"                hm[{_ix('i')}] = {hexpr}",
        f"            for i in range(run - {reach_h + reach_v}):",
        f"                vm[{_ix('i')}] = {vexpr}",
        *_run_outputs(win, "vm[r + ow * {sw}]", dt, "vm"),
    ]


POOL_RUN_CHUNK = 2048
"""The in-place pool kernels take a task's planes in chunks of at most this many elements (one
plane where a plane is larger), so that their scratch rows stay in the L1 cache. A task's planes
all at once (SqueezeNet's 2x64 @31 MaxPool, one thread: 64 planes of 31x31 a task, two 240 KiB scratch runs)
took 50.7 us on an Emerald Rapids core, in chunks 42.1 (benchmarks/bench_conv.py --only pools)."""


def _chunk(hw: int, per: int) -> int:
    """Planes of ``hw`` elements per chunk of a task of ``per`` planes (:data:`POOL_RUN_CHUNK`)."""
    return max(1, min(per, POOL_RUN_CHUNK // hw))


def _chunk_loop(win: Window, dt: str, prange: str, per: int, scratch: Sequence[str]) -> list[str]:
    """The head of an in-place pool kernel: ``xf``, the input as one flat run; tasks ``t`` of
    ``per`` planes, each allocating the ``scratch`` runs of one chunk (:func:`_chunk`); within a
    task its planes ``v0 .. v1`` a chunk at a time, ``b`` the chunk's first element and ``run`` its
    length."""
    hw = win.h * win.w
    units = win.n * win.c
    chunk = _chunk(hw, per)
    return [
        f"    xf = a0.reshape({units * hw})",
        f"    for t in {prange}({-(-units // per)}):",
        *[f"        {name} = np.empty({chunk * hw}, dtype=np.{dt})" for name in scratch],
        f"        t1 = min((t + 1) * {per}, {units})",
        f"        for v0 in range(t * {per}, t1, {chunk}):",
        f"            v1 = min(v0 + {chunk}, t1)",
        f"            b = v0 * {hw}",
        f"            run = (v1 - v0) * {hw}",
    ]


def _run_outputs(win: Window, value: str, dt: str = "", gather: str = "") -> list[str]:
    """The outputs of a chunk of planes ``v0 .. v1``: each read at its window's corner
    ``r + ow * sw`` of the chunk's run (``value``, with ``{sw}`` for the stride), or, where
    ``value`` is a plain read of the scratch run ``gather``, copied out of it in vectors
    (:func:`_gather_outputs`)."""
    if gather:
        isz = np.dtype(dt).itemsize
        lines = _gather_outputs(win, dt, f"{gather}.ctypes.data + (v - v0) * {win.h * win.w * isz}",
                                win.sh * win.w, win.sw, "v", "                ")
        if lines:
            return ["            for v in range(v0, v1):", *lines]
    return [
        "            for v in range(v0, v1):",
        f"                c = v % {win.c}",
        f"                n = v // {win.c}",
        f"                o = (v - v0) * {win.h * win.w}",
        "                for oh in range(a1.shape[2]):",
        f"                    r = o + oh * {win.sh * win.w}",
        "                    for ow in range(ow_n):",
        "                        a1[n, c, oh, ow] = " + value.format(sw=win.sw),
    ]


def average_pool_algo(win: Window) -> str:
    """The AveragePool kernel for ``win``: ``flat`` (:func:`_average_run_lines`) for a strided
    window inside the input, ``phase`` (:func:`_phase_lines`) for one that leaves it, ``row``
    (:func:`_average_lines`) otherwise. Measured (``benchmarks/bench_conv.py --only pools``, one
    Emerald Rapids thread, us; flat / row / phase, since the chunks of :data:`POOL_RUN_CHUNK`): 2x2
    s2 2x128 @16 23.5 / 41.8 / 37.6, 2x128 @32 44.1 / 101.6 / 105.0, 128 @56 86.7 / 149.0 /
    101.1 (the row kernel reads its input at the stride)."""
    if not phase_applies(win):
        return "row"
    return "flat" if _inside(win) else "phase"


def _inside(win: Window) -> bool:
    """Whether every window lies inside the input (no pads, no ceil_mode overhang)."""
    return win.ph == win.pw == 0 and win.hp == win.h and win.wp == win.w


def _average_run_lines(win: Window, dt: str, prange: str, per: int) -> list[str]:
    """An AveragePool whose windows never leave the input, as :func:`_max_run_lines`: the taps
    summed in window order at every position of a chunk of a task's planes in one flat loop, each
    output then read at its window's corner and divided by the count."""
    w = win.w
    reach = (win.kh - 1) * win.dh * w + (win.kw - 1) * win.dw
    expr = " + ".join(f"xf[{_ix(f'b + i + {kh * win.dh * w + kw * win.dw}')}]"
                      for kh in range(win.kh) for kw in range(win.kw))
    return [
        *_chunk_loop(win, dt, prange, per, ("sm",)),
        f"            for i in range(run - {reach}):",
        f"                sm[{_ix('i')}] = {expr}",
        *_run_outputs(win, "sm[r + ow * {sw}] / (cnt_h[oh] * cnt_w[ow])"),
    ]


def _phase_lines(win: Window, dt: str, prange: str, threads: int, average: bool = False) -> list[str]:
    """A strided pool over phase planes, as the conv's plane kernel (codegen/conv.py): each
    (image, channel) plane is copied into ``sh x sw`` phase planes between -inf pads (0 for an
    AveragePool, whose taps are summed in window order and divided by the count), phase
    (a, b) holding padded rows ``a + sh * i`` and columns ``b + sw * u`` on a grid of width
    ``wg = ow + max (kw * dw) // sw``. On that grid output position ``oh * wg + ow`` reads, for
    tap (kh, kw), phase ``((kh * dh) % sh, (kw * dw) % sw)`` at offset ``(kh * dh) // sh * wg +
    (kw * dw) // sw``: every tap is one flat unit-stride run, and the window's max is one flat
    loop over the grid (its ``wg - ow`` extra columns computed and dropped), vectorized however
    narrow the rows and whatever the stride. The flat separable loops (:func:`_max_lines`)
    computed the max at every input position, ``sh * sw`` times the outputs, and read it back at
    the stride one output at a time."""
    rh = max((kh * win.dh) // win.sh for kh in range(win.kh))
    rw = max((kw * win.dw) // win.sw for kw in range(win.kw))
    wg, hq = win.ow + rw, win.oh + rh
    size = hq * wg + rw  # the last row's run reads rw past the grid
    taps = [(kh * win.dh, kw * win.dw) for kh in range(win.kh) for kw in range(win.kw)]
    used = sorted({(dy % win.sh) * win.sw + dx % win.sw for dy, dx in taps})
    slot = {p: i for i, p in enumerate(used)}
    terms = [f"x{slot[(dy % win.sh) * win.sw + dx % win.sw]}[{_ix(f'q + {(dy // win.sh) * wg + dx // win.sw}')}]"
             for dy, dx in taps]
    # a sum in window order: the row kernel's order, its padded taps (zeros here) skipped there
    expr = " + ".join(terms) if average else max_of(terms, dt)
    pad = "0.0" if average else "-np.inf"
    units = win.n * win.c
    per = -(-units // (2 * threads))
    # A batch of planes lies one after another in the scratch, so that the window's loop runs
    # over all of them at once: a 3x3 s2 pool of a 7x7 plane has a 3x4 grid, shorter than one
    # vector. The positions between two planes' grids are computed and dropped; their reads stay
    # inside the later plane.
    batch = max(1, min(per, POOL_SCRATCH_ELEMENTS // (len(used) * size)))
    lines = [
        f"    span = (ow_n + {rw}) * {win.oh}",  # a grid's run, from a width LLVM cannot see (the module's rows)
        f"    for t in {prange}({-(-units // per)}):",
        # the pads are written once per task; each plane overwrites only the interior
        f"        xq = np.full(({len(used)}, {batch * size}), np.{dt}({pad}))",
        f"        og = np.empty({batch * size}, dtype=np.{dt})",
        # the phase planes' views, once per task: a view made per row costs two reference-count
        # updates (made per row, a 3x3 s2 pool of 2x64 planes of 31x31 ran about 3x slower)
        *(f"        x{i} = xq[{i}]" for i in range(len(used))),
        f"        for v0 in range(t * {per}, min((t + 1) * {per}, {units}), {batch}):",
        f"            v1 = min(v0 + {batch}, (t + 1) * {per}, {units})",
        "            for v in range(v0, v1):",
        f"                c = v % {win.c}",
        f"                n = v // {win.c}",
        f"                o = (v - v0) * {size}",
        "                for ih in range(a0.shape[2]):",
        f"                    i = (ih + {win.ph}) // {win.sh}",
        f"                    if i >= {hq}:",
        "                        continue",
        f"                    a = (ih + {win.ph}) % {win.sh}",
        f"                    r = o + i * {wg}",
    ]
    # Input column j * sw + e lands in phase column (e + pw) % sw at grid column j + (e + pw) // sw:
    # one loop over j stores the row's sw interleaved columns into their phase rows (a load group
    # LLVM vectorizes; a copy per phase read the row at the stride, scalar). Its trip count keeps
    # every store inside the grid row, and is read at run time (a constant one is unrolled first);
    # the row's last columns follow one by one.
    cp = phase_copy(win, wg)
    for a in range(win.sh):
        live = [(e, b, o) for e, b, o in cp.lead if a * win.sw + b in slot]
        if not live:
            continue
        lines.append(f"                    {'if' if a == 0 else 'elif'} a == {a}:")
        lines.append(f"                        for j in range(w_n // {win.sw} - {win.w // win.sw - cp.full}):")
        lines += [f"                            x{slot[a * win.sw + b]}[{_ix(f'r + j + {o}')}] = a0[n, c, ih, {_ix(f'j * {win.sw} + {e}')}]"
                  for e, b, o in live]
        lines += [f"                        x{slot[a * win.sw + b]}[r + {u}] = a0[n, c, ih, {col}]"
                  for col, b, u in cp.tail if a * win.sw + b in slot]
    lines += [
        f"            for q in range((v1 - v0 - 1) * {size} + span):",
        f"                og[{_ix('q')}] = {expr}",
    ]
    isz = np.dtype(dt).itemsize
    gather = [] if average else _gather_outputs(win, dt, f"og.ctypes.data + (v - v0) * {size * isz}", wg, 1, "v",
                                                "                ")
    if gather:
        return [*lines, "            for v in range(v0, v1):", *gather]
    lines += [
        "            for v in range(v0, v1):",
        f"                c = v % {win.c}",
        f"                n = v // {win.c}",
        f"                o = (v - v0) * {size}",
        "                for oh in range(a1.shape[2]):",
        f"                    r = o + oh * {wg}",
        "                    for ow in range(ow_n):",
        "                        a1[n, c, oh, ow] = " + ("og[r + ow] / (cnt_h[oh] * cnt_w[ow])" if average else "og[r + ow]"),
    ]
    return lines


def _ix(expr: str) -> str:
    """An index LLVM may take as unsigned (nothing here is negative): vectorizable loads."""
    return f"numba.uint64({expr})"


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
