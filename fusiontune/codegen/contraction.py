"""Contraction kernels: MatMul through the register-blocked micro-kernel (codegen/microkernel.py)
over weights packed at build time, or through BLAS (codegen/blas.py), with the fused epilogue
applied in cache.

**Packed** (``matmul_algo="packed"``, the default wherever it applies, unless scipy's BLAS is an
OpenBLAS running an AVX-512 sgemm (:func:`~fusiontune.codegen.blas.blas_has_avx512`), or the
product one vector wide over many rows (:func:`packed_pays`): the right
operand is a constant without batch dims, the reduction 16 to :data:`PACKED_MAX_K` long or the
product small, the left operand not transposed). The weights are packed once, when the program is built
(:func:`pack_matmul_weights`, a :class:`~fusiontune.codegen.common.Derived` argument), into column
blocks of the micro-kernel's width; a task copies a panel of its rows transposed, runs the
micro-kernel over every (row block, column block) pair into a panel of the product, and applies
the epilogue to that panel while it is in cache (:func:`_packed_lines`). OpenBLAS's sgemm spends
microseconds per call on the shapes of small transformers and reaches about 115 GFLOP/s here at
any size; the packed path ran 34x64x64 1.6x, 24x128x128 2.4x, 512x768x768 1.8x and 512x768x3072
1.6x faster (one core, benchmarks figures in the README). That was OpenBLAS's AVX2 kernel on an
AMD EPYC. On an Intel Emerald Rapids core OpenBLAS runs its AVX-512 kernel (``SkylakeX``), and it
beat the packed path at every shape timed (one thread, us, packed / BLAS: 512x32x8 15.1 / 7.3,
34x64x64 3.6 / 2.5, 24x128x128 7.3 / 5.7, 512x96x64 79 / 56, 512x768x768 4749 / 4489); whole
transformer programs ran 1.10x to 1.19x faster with BLAS. So where OpenBLAS has an AVX-512 sgemm
the default is BLAS; a schedule can still ask for either. (Two machines are the evidence for
this rule: an AVX-512 OpenBLAS on an AMD core is untested.)

**BLAS** (``matmul_algo="blas"``, and every product the packed path does not take).

Without a row block the kernel cuts the product into one chunk of rows per thread; each task
computes its chunk into one buffer and then runs the epilogue over those rows (in place when an
output of the same shape can hold it). Fewer, larger GEMM calls are faster here: BLAS packs the
whole weight matrix once per call, so 1024x512 @ 512x2048 on one core took 14 ms in one call or
in 256-row calls, 18 ms in 128-row calls and 33 ms in 32-row calls. With
``row_block = RB`` (MatMulRowSplitFusionPass) it computes RB rows at a time into a small scratch
block and applies the epilogue to that block while it is still in cache, so the product never
travels to memory: the split fusion of CANN's model, where the MatMul is split into row blocks
that each fuse with the epilogue.

A MatMul with ``trans_a`` / ``trans_b`` hands BLAS the stored operand with a transpose flag
(``gemm_t32/64``); a row block of a transposed left operand is a column window of it.

When the right operand is a plain weight matrix (no batch dims), the batch dims of the left operand
are folded into its rows, so the whole layer is one large GEMM.

``math="approx"`` applies to the epilogue as in a loop nest (a GELU after a Linear vectorizes).
``precision`` does not: low-precision emulation is a loop-nest feature, and the product itself is
a float32 / float64 BLAS call either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from fusiontune.codegen import microkernel
from fusiontune.codegen.blas import blas_has_avx512, gemm_name
from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    Derived,
    KernelSource,
    Lowered,
    NotFusable,
    align,
    decorator,
    kernel_header,
    task_threads,
)
from fusiontune.codegen.rules import SCALAR_RULES, literal, scalar_expr
from fusiontune.ir.graph import Shape
from fusiontune.ir.ops import get_op


def _batch_index(shape: Shape, out_batch: Shape) -> tuple[int, str]:
    """The operand's flattened batch count, and its batch index as an expression of ``bi``.

    ``bi`` runs over the output's flattened batch; dims where the operand broadcasts (size 1)
    contribute nothing, the others their digit of ``bi`` times the operand's own stride.
    """
    b = align(shape[:-2], len(out_batch))
    if any(d not in (1, o) for d, o in zip(b, out_batch, strict=True)):
        raise NotFusable(f"MatMul operand batch {shape[:-2]} does not broadcast to {out_batch}")
    count = int(np.prod(b)) if b else 1
    if count == 1:
        return 1, "0"
    if tuple(b) == tuple(out_batch):
        return count, "bi"
    terms: list[str] = []
    out_stride, own_stride = 1, 1
    for d in reversed(range(len(out_batch))):
        size = out_batch[d]
        if b[d] == size and size > 1:
            terms.append(f"((bi // {out_stride}) % {size}) * {own_stride}")
            own_stride *= size
        out_stride *= size
    return count, "(" + " + ".join(terms) + ")"


def _epilogue_view(shape: Shape, out: Shape, flat: bool) -> Shape | None:
    """The (B, M, N) view of an epilogue array, or None when it cannot be expressed."""
    s = align(shape, len(out))
    if any(d not in (1, o) for d, o in zip(s, out, strict=True)):
        return None
    batch, m, n = s[:-2], s[-2], s[-1]
    full_b = tuple(batch) == tuple(out[:-2]) and any(d != 1 for d in out[:-2])
    ones_b = all(d == 1 for d in batch)
    if flat:
        if all(d == 1 for d in (*batch, m)):
            return (1, 1, n)
        if tuple(batch) == tuple(out[:-2]) and m == out[-2]:
            return (1, int(np.prod(out[:-1])), n)
        return None
    if not (full_b or ones_b):
        return None
    return (int(np.prod(batch)) if full_b else 1, m, n)


def generate_contraction_kernel(
    low: Lowered, inputs: Sequence[str], outputs: Sequence[str], name: str, row_block: int = 0, approx: bool = False,
    algo: str = "",
) -> KernelSource:
    """Generate MatMul (+ bias) + elementwise epilogue as one kernel.

    ``approx`` writes the epilogue's exp, tanh and erf as codegen/numerics.py's approximations.
    ``algo``: ``"packed"`` (the micro-kernel over weights packed at build time), ``"blas"``, or
    ``""``: packed wherever it applies (:func:`packed_applies`), else BLAS.

    Raises:
        NotFusable: not exactly one MatMul, an epilogue op that is not elementwise over the
            MatMul's output, or operands whose broadcasting the kernel does not express.
    """
    mms = [n for n in low.nodes if n.op == "MatMul"]
    if len(mms) != 1:
        raise NotFusable("a contraction kernel holds exactly one MatMul")
    mm = mms[0]
    epi = [n for n in low.nodes if n is not mm]
    for n in epi:
        if n.op not in SCALAR_RULES:
            raise NotFusable(f"{n.op} cannot be a MatMul epilogue")
    y = mm.outputs[0]
    oshape = low.values[y].shape
    for n in epi:
        for v in (*n.inputs, *n.outputs):
            if v in low.scalars:
                continue
            s = low.values[v].shape
            if len(s) > len(oshape) or any(d not in (1, o) for d, o in zip(align(s, len(oshape)), oshape, strict=True)):
                raise NotFusable(f"epilogue value {v} {s} does not broadcast to {oshape}")
    for o in outputs:
        if low.values[o].shape != oshape:
            raise NotFusable(f"output {o} is not of the MatMul's shape")
    a, b = mm.inputs[0], mm.inputs[1]
    bias = mm.inputs[2] if len(mm.inputs) == 3 else None
    dtype = low.values[y].dtype
    if low.values[a].dtype != dtype or low.values[b].dtype != dtype or dtype not in ("float32", "float64"):
        raise NotFusable("MatMul needs float32 or float64 operands of one dtype")
    mm_attrs = {**get_op("MatMul").attrs, **mm.attrs}
    ta, tb = bool(mm_attrs["trans_a"]), bool(mm_attrs["trans_b"])
    ob = oshape[:-2]
    M, N = oshape[-2], oshape[-1]
    K = low.values[a].shape[-2] if ta else low.values[a].shape[-1]
    (ba, a_b), (bb, b_b) = _batch_index(low.values[a].shape, ob), _batch_index(low.values[b].shape, ob)
    ext = [v for v in inputs if v not in (a, b)]
    # An epilogue may read a MatMul operand too (x @ W + x): it gets a second argument, the same
    # buffer viewed over the output's domain.
    operand_reads = [v for v in dict.fromkeys((a, b)) if any(v in n.inputs for n in epi)]
    # A transposed left operand is stored (K, M): its batches cannot fold into its rows.
    flat = bb == 1 and not ta and (a_b == "bi" or not ob) and all(
        _epilogue_view(low.values[v].shape, oshape, True) is not None for v in (*ext, *operand_reads, *outputs)
    )
    if flat:
        BC, MM = 1, int(np.prod(oshape[:-1]))
        views = {a: (1, MM, K), b: (1, N, K) if tb else (1, K, N)}
        a_b = b_b = "0"
    else:
        BC, MM = int(np.prod(ob)), M
        views = {a: (ba, K, M) if ta else (ba, M, K), b: (bb, N, K) if tb else (bb, K, N)}
    if a == b and ta != tb:
        raise NotFusable("MatMul reads one operand both plain and transposed")
    epi_key = {v: f"{v}#epilogue" for v in operand_reads}
    for v in (*ext, *operand_reads, *outputs):
        view = _epilogue_view(low.values[v].shape, oshape, flat)
        if view is None:
            raise NotFusable(f"epilogue array {v} {low.values[v].shape} has no view over {oshape}")
        views[epi_key.get(v, v)] = view
    args = [ArgSpec(v, views[v], low.values[v].dtype, "in") for v in inputs]
    args += [ArgSpec(v, views[epi_key[v]], low.values[v].dtype, "in") for v in operand_reads]
    args += [ArgSpec(v, views[v], low.values[v].dtype, "out") for v in outputs]
    keys = [*inputs, *(epi_key[v] for v in operand_reads), *outputs]
    an = {k: f"a{i}" for i, k in enumerate(keys)}
    slot = {k: i for i, k in enumerate(keys)}  # format-safe placeholder ids (names hold ':' and '/')

    def idx(v: str, bi: str, r: str, c: str) -> str:
        vb, vm, vn = views[v]
        return f"[{bi if vb != 1 else '0'}, {r if vm != 1 else '0'}, {c if vn != 1 else '0'}]"

    # The epilogue body, as statements over locals; `acc` holds the product element.
    var: dict[str, str] = {s: literal(val, low.values[s].dtype) for s, val in low.scalars.items()}
    var[y] = "acc"
    body: list[str] = []
    if bias is not None:
        bias_read = var[bias] if bias in low.scalars else f"{an[bias]}{{idx_{slot[bias]}}}"
        body.append(f"acc = acc + {bias_read}")
    reads = {i for n in epi for i in n.inputs if i in ext}
    for v in ext:
        if v in reads:
            var[v] = f"e_{an[v]}"
            body.append(f"{var[v]} = {an[v]}{{idx_{slot[v]}}}")
    for v in operand_reads:
        key = epi_key[v]
        var[v] = f"e_{an[key]}"
        body.append(f"{var[v]} = {an[key]}{{idx_{slot[key]}}}")
    for i, n in enumerate(epi):
        dt = low.values[n.outputs[0]].dtype
        lit_dt = dt if dt != "bool" else dtype
        var[n.outputs[0]] = f"v{i}"
        expr = scalar_expr(n.op, [var[x] for x in n.inputs], {**get_op(n.op).attrs, **n.attrs}, lambda c, d=lit_dt: literal(c, d), dt, approx)
        body.append(f"v{i} = {expr}")
    for o in outputs:
        body.append(f"{an[o]}{{idx_{slot[o]}}} = {var[o]}")
    has_epilogue = bool(epi) or bias is not None

    # Where the product goes when there is no row block: the MatMul output if the group exports
    # it, else (in place) an output of the same dtype, else a scratch buffer.
    if y in outputs:
        acc_buf = an[y]
    else:
        same = [o for o in outputs if low.values[o].dtype == dtype]
        acc_buf = an[same[0]] if same else None

    def epilogue(indent: str, bi: str, r: str, acc_expr: str, in_place_product: bool = False) -> None:
        lines.append(f"{indent}for c in range({N}):")
        lines.append(f"{indent}    acc = {acc_expr}")
        fill = {f"idx_{slot[v]}": idx(v, bi, r, "c") for v in views if v in slot}
        # The product already sits in the MatMul's output: storing it back is a no-op, and one
        # more store array can stop LLVM from vectorizing the loop (its alias checks give up).
        skip = f"{an[y]}{{idx_{slot[y]}}} = acc" if in_place_product and y in slot else None
        for stmt in body:
            if stmt != skip:
                lines.append(f"{indent}    " + stmt.format(**fill))

    parallel_rows = BC * MM * N * max(K, 1) >= PARALLEL_MIN_ELEMENTS * 8
    if algo not in ("", "packed", "blas"):
        raise NotFusable(f"matmul_algo {algo!r}: packed or blas")
    if algo == "" and (blas_has_avx512() or not packed_pays(MM, N, dtype)):
        algo = "blas"  # OpenBLAS's AVX-512 sgemm (module docstring), or a product one vector wide
    if algo != "blas" and flat and b in low.arrays and b not in operand_reads and a != b and packed_applies(MM, N, K):
        uk = packed_block(MM, N, dtype)
        packed = Derived(f"{b}#mm{uk.nr}{'t' if tb else ''}", b, "fusiontune.codegen.contraction:pack_matmul_weights",
                         (uk.nr, int(tb)))
        nmb = -(-N // uk.nr)
        args = [ArgSpec(packed.value, (nmb, K, uk.nr), dtype, "in") if x.value == b else x for x in args]
        # a task per row chunk: one row (a GEMV) is one task, which runs serial
        parallel = MM * N * K >= PACKED_PARALLEL_MACS and MM > 1
        lines = [decorator(args, parallel=parallel, reassoc=False), f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}):"]
        lines += _packed_lines(an[a], an[b], MM, N, K, uk, row_block, dtype, parallel)
        epilogue("                ", "0", "r", "blk[r - q0, c]")
        code = "\n".join(lines) + "\n"
        # Imported by its full name, so that the kernel cache key covers microkernel.py. One block
        # registered by itself (10 ms) rather than the dispatcher of every block (170 ms in each
        # process that builds the program): this kernel's block is a literal.
        source = kernel_header(code, ["from fusiontune.codegen.microkernel import Shape, register",
                                      f"uk = register(Shape({dtype!r}, {uk.mr}, {uk.nv}))"]) + code
        nbytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in args)
        flops = 2 * MM * N * K + MM * N * len(epi)
        return KernelSource(name, source, tuple(args), "contraction", nbytes, flops, (packed,))
    # BLAS runs single-threaded inside numba's parallel loops (see runtime.threads): the product
    # is cut into row chunks, one per thread, or into the row blocks of the split point.
    if row_block and has_epilogue:
        chunk = min(row_block, MM)
    elif parallel_rows:
        # The thread count is a literal: numba.get_num_threads() would make the kernel uncacheable.
        chunk = max(1, -(-MM // max(1, numba.config.NUMBA_NUM_THREADS // BC)))
    else:
        chunk = MM
    size = str(chunk)
    nblk = str(-(-MM // chunk))
    parallel_rows = parallel_rows and BC * int(nblk) > 1  # one task (a GEMV): serial
    lines = [decorator(args, parallel=parallel_rows, reassoc=False), f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}):"]
    emit = lines.append
    prange = "numba.prange" if parallel_rows else "range"
    if not (row_block and has_epilogue) and acc_buf is None:
        emit(f"    scratch = np.empty(({BC}, {MM}, {N}), dtype=np.{dtype})")
        acc_buf = "scratch"
    emit(f"    nblk = {nblk}")
    emit(f"    for t in {prange}({BC} * nblk):")
    emit("        bi = t // nblk")
    emit(f"        r0 = (t % nblk) * {size}")
    emit(f"        r1 = min(r0 + {size}, {MM})")
    gemm = gemm_name(dtype, ta or tb)
    # A row block of op(a) is a column window of a stored transposed.
    a_rows = f"{an[a]}[{a_b}, :, r0:r1]" if ta else f"{an[a]}[{a_b}, r0:r1]"
    flags = f", {int(ta)}, {int(tb)}" if ta or tb else ""
    if row_block and has_epilogue:
        emit(f"        blk = np.empty(({chunk}, {N}), dtype=np.{dtype})")
        emit(f"        {gemm}({a_rows}, {an[b]}[{b_b}], blk[:r1 - r0]{flags})")
        emit("        for r in range(r0, r1):")
        epilogue("            ", "bi", "r", "blk[r - r0, c]")
    else:
        emit(f"        {gemm}({a_rows}, {an[b]}[{b_b}], {acc_buf}[bi, r0:r1]{flags})")
        if has_epilogue:
            # The epilogue follows in the same task, over the rows the task's GEMM just wrote (no
            # second parallel region). With one batch its index is the literal 0, as in the
            # outputs' indices: an in-place epilogue that read acc_buf[bi, r, c] and wrote
            # acc_buf[0, r, c] made LLVM's runtime alias check fail (the addresses are equal)
            # and run the scalar loop, 4.5x slower with math="approx".
            bix = "bi" if BC != 1 else "0"
            emit("        for r in range(r0, r1):")
            epilogue("            ", bix, "r", f"{acc_buf}[{bix}, r, c]", bias is None and y in outputs)
    code = "\n".join(lines) + "\n"
    # Only kernels that read an operand transposed import gemm_t*: the others' sources (cache keys) stay.
    blas = "gemm_t32, gemm_t64" if ta or tb else "gemm32, gemm64"
    source = kernel_header(code, [f"from fusiontune.codegen.blas import {blas}"]) + code
    nbytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in args)
    flops = 2 * BC * MM * N * K + BC * MM * N * len(epi)
    return KernelSource(name, source, tuple(args), "contraction", nbytes, flops)


# ---- the packed path: the micro-kernel over weights packed at build time ----------------------
PACKED_MAX_K = 4096
"""A MatMul with a longer reduction runs through BLAS: the packed path does not block the
reduction, so a task's panels of ``K`` rows would leave the caches."""

PACKED_PANEL_BYTES = 256 << 10
"""A task packs its rows of the left operand, transposed, in panels of at most this many bytes
(and at least one register block of rows): the panel is read once per column block of the
weights, and stays in L2 meanwhile."""


PACKED_PARALLEL_MACS = 1_500_000
"""A packed product runs in parallel from this many multiply-adds. Two threads against one, on
the 2-core VM (us): 34x256x64 7.6 / 6.6, 24x128x128 6.1 / 5.0, 64x256x64 12.6 / 11.6, but
128x128x128 17.2 / 23.6 and 128x512x128 54 / 87: below about 1.5M a parallel region and the
halved row blocks cost more than the second core gives (BLAS's threshold, 262k, was set for
products twice as slow)."""

PACKED_PANEL_ROWS = 256
"""At most this many rows per panel: a short reduction would otherwise make one panel of
thousands of rows, and its product block would leave L2 before the epilogue reads it."""


PACKED_ONE_VECTOR_ROWS = 64
"""See :func:`packed_pays`."""


def packed_pays(m: int, n: int, dtype: str) -> bool:
    """Whether the default (no ``matmul_algo``) takes the packed path for an ``m``-row product of
    ``n`` columns where it applies: not when the columns fit one vector register (16 float32 lanes
    with AVX-512) over :data:`PACKED_ONE_VECTOR_ROWS` rows or more. The micro-kernel's block is
    then one vector wide, a broadcast for every multiply-add, and 8 columns fill half of each
    vector; over a few rows BLAS's cost per call dominates instead. On the 2-core AMD EPYC (Zen 5)
    VM, one thread, OpenBLAS's AVX2 kernel, us of packed / BLAS, M x K x N with a bias,
    interleaved: 512x32x8 8.7 / 5.0, 512x128x8 30.3 / 14.6, 512x32x16 9.8 / 8.5, 512x128x16 30.5 /
    24.0, 96x128x16 6.5 / 5.5, 64x64x16 2.7 / 2.7, 48x64x16 2.1 / 2.2, 16x64x16 1.2 / 1.5,
    2x1024x10 2.3 / 5.6; packed ahead from two vectors on (512x32x32 13.2 / 14.7, 512x128x32 39.3 /
    42.6). A ``matmul_algo="packed"`` schedule still runs such a product packed."""
    return n > microkernel.lanes(dtype) or m < PACKED_ONE_VECTOR_ROWS


def packed_applies(m: int, n: int, k: int) -> bool:
    """Whether the packed path takes an ``m x k @ k x n`` product (its weights constant): a
    reduction of 16 to :data:`PACKED_MAX_K`, or any small product. Below 16 a micro-kernel call
    does too little per block: 2048x48x8 ran 0.74x BLAS's speed, 2048x48x16 0.88x, 2048x96x16
    1.11x, 2048x48x32 1.0x."""
    return m > 0 and n > 0 and 0 < k <= PACKED_MAX_K and (k >= 16 or m * n * k <= 1 << 16)


def packed_block(m: int, n: int, dtype: str) -> microkernel.Shape:
    """The register block of least predicted time: the product padded to whole blocks, over the
    block's measured efficiency (:func:`microkernel.efficiency`)."""
    best: tuple[float, microkernel.Shape] | None = None
    for mr, nv in microkernel.blocks():
        uk = microkernel.Shape(dtype, mr, nv)
        cost = (-(-m // mr) * mr) * (-(-n // uk.nr) * uk.nr) / microkernel.efficiency(mr, nv)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, uk)
    assert best is not None
    return best[1]


def pack_matmul_weights(w: np.ndarray, nr: int, transposed: int = 0) -> np.ndarray:
    """MatMul weights ``(K, N)`` (``(N, K)`` when ``transposed``) packed for the micro-kernel:
    ``(N / nr column blocks, K, nr)``, the columns past N zero."""
    w = w.T if transposed else w
    k, n = w.shape
    nmb = -(-n // nr)
    wp = np.zeros((k, nmb * nr), dtype=w.dtype)
    wp[:, :n] = w
    return np.ascontiguousarray(wp.reshape(k, nmb, nr).transpose(1, 0, 2))


def _packed_lines(ax: str, aw: str, m: int, n: int, k: int, uk: microkernel.Shape, row_block: int, dtype: str,
                  parallel: bool) -> list[str]:
    """The packed product, up to the epilogue: each task takes a run of rows; per panel of rows
    (:data:`PACKED_PANEL_BYTES`) it copies them transposed and zero-padded to whole register
    blocks (``xt``, ``K x rows``: the micro-kernel broadcasts its rows from there), then for
    every column block of the packed weights (``K x nr``, read from L1/L2 by every row block)
    runs the micro-kernel over the panel's row blocks into ``blk``, a panel of the product that
    the epilogue (emitted after these lines, indented under ``for r in range(q0, q1)``) reads
    while it is in cache. Measured on one core against OpenBLAS's sgemm in a standalone numba
    loop of these steps (the copy and the output included): 34x64x64 1.9 us against 4.0, 34x256x64 6.0 against 15.4, 24x128x128 4.4
    against 11.3, 128x128x128 25 against 40; 2048x48x8 20 against 20."""
    item = np.dtype(dtype).itemsize
    mr, nr = uk.mr, uk.nr
    nmb = -(-n // nr)
    ldc = nmb * nr
    chunk = -(-m // task_threads(parallel))
    # rows per panel: the split point's row block, else what fits PACKED_PANEL_BYTES
    panel = row_block or max(mr, min(-(-chunk // mr) * mr, PACKED_PANEL_ROWS, (PACKED_PANEL_BYTES // (k * item)) // mr * mr))
    cols = -(-panel // mr) * mr  # the panel's rows padded to whole register blocks
    if cols * item % 512 == 0:
        # a row stride of a multiple of 512 bytes maps the K rows of a column to a few cache sets
        # (2048 rows x K 32 ran 6x slower than BLAS, the copy and the reads thrashing L1)
        cols += 64 // item
    ntask = -(-m // chunk)
    prange = "numba.prange" if parallel else "range"
    return [
        f"    for t in {prange}({ntask}):",
        f"        r0 = t * {chunk}",
        f"        r1 = min(r0 + {chunk}, {m})",
        f"        xt = np.zeros(({k}, {cols}), dtype=np.{dtype})",
        f"        blk = np.empty(({cols}, {ldc}), dtype=np.{dtype})",
        "        taps = np.zeros(1, dtype=np.int64)",
        f"        for q0 in range(r0, r1, {panel}):",
        f"            q1 = min(q0 + {panel}, r1)",
        "            for r in range(q0, q1):",
        f"                for kk in range({k}):",
        f"                    xt[kk, r - q0] = {ax}[0, r, kk]",
        f"            nq = -(-(q1 - q0) // {mr}) * {mr}",
        f"            for jb in range({nmb}):",
        f"                for rb in range(0, nq, {mr}):",
        f"                    uk({k}, xt.ctypes.data + rb * {item}, {cols}, taps.ctypes.data,"
        f" {aw}[jb].ctypes.data, {nr}, taps.ctypes.data, blk.ctypes.data + (rb * {ldc} + jb * {nr}) * {item},"
        f" {ldc}, 1, 0)",
        "            for r in range(q0, q1):",
    ]
