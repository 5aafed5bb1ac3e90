"""Attention kernels: ``softmax(q @ k^T * scale + mask) @ v`` in one pass over the keys (flash attention).

The kernel runs in parallel over (batch x query row blocks of ``q_block`` rows), each task taking
a run of them and allocating its scratch once. For each row block it walks the keys in blocks of
``kv_block`` (the node's attribute, FlashAttentionFusionPass's split point; 0 = all keys in one
block):

1. ``S = Q_blk @ K_blk^T`` by one BLAS call (``sgemm`` with K transposed, no copy),
2. ``S = S * scale + mask`` and the row maxima, one sweep per row, then ``S - m'``,
3. the online softmax: with the running max ``m`` and running sum ``l`` of each row, a new max
   ``m'`` rescales what was accumulated so far by ``exp(m - m')``; ``P = exp(S - m')``. The
   exps of the whole block (and each row's ``m - m'``, kept in one more column of S) are one
   flat loop, which vectorizes however few keys a row has,
4. ``acc = acc * exp(m - m') + P @ V_blk`` by one BLAS call (beta = 1),

and finally ``out = acc / l``. With all keys in one block there is nothing to rescale: P is
normalised (``P / l``, the reference's softmax) and ``P @ V`` written by BLAS straight into the
output rows. Scores never leave the cache: the unfused program writes and reads the (Sq, Sk)
score matrix three times per head.

**Skipped key blocks (exact).** With a mask, a key block whose every score is provably at least
``UNDERFLOW`` below the row's running max adds exactly nothing: ``exp`` of it is 0 in the kernel's
dtype, the max does not move (so nothing is rescaled) and ``0 @ V`` adds 0. The proof is a bound,
``max_j mask[i, j] + |scale| * ||q_i|| * max_j ||k_j||``, computed from norms before the block's
GEMM; a block whose values of V are not all finite is never skipped (``0 * inf`` is NaN in the
reference). This is what a causal mask buys: the blocks above the diagonal are never computed.

**Special values.** A row whose scores are all ``-inf`` is NaN, as the reference is (``-inf - -inf``):
the kernel subtracts 0 instead of an infinite max, so ``P = 0`` and ``l = 0``, and ``0 / 0`` is NaN.
A row that is masked everywhere with a finite value (``-1e9``) is the softmax of values that lost
their score to rounding, in the reference as here: such rows agree only to that rounding.

``math="approx"`` computes exp with codegen/numerics.py's ``exp_approx`` (vectorizes); the
default calls libm. ``precision`` does not apply (as for contraction kernels).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numba
import numpy as np

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
from fusiontune.codegen.rules import _exp as rules_exp
from fusiontune.codegen.rules import _f32_call, literal
from fusiontune.ir.ops import get_op

ATTENTION_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
"""A hash of this file: kernels inline the GEMM helpers below, so their cache key quotes it."""

DEFAULT_Q_BLOCK = 64
"""Query rows per task when the keys are cut into blocks. 64 rows x 64..128 keys keep S, P and the
accumulator in L1/L2, and the GEMMs are large enough for BLAS to run near its peak (measured in
benchmarks/bench_attention.py); small row blocks also let the causal skip test drop more blocks."""

MAX_Q_BLOCK = 256
"""Query rows per task, at most, when all keys are one block (``kv_block = 0``)."""

SCORE_BLOCK_BYTES = 256 << 10
"""With all keys in one block, the row block grows (up to :data:`MAX_Q_BLOCK`) while its score
block S stays within this many bytes (in L2): the GEMMs run faster on more rows. 4x8x256x64
float32 on one core: 7.2 ms with 64 rows, 7.1 with 128, 6.3 with 256 (S = 256 KiB)."""

UNDERFLOW = {"float32": 128.0, "float64": 760.0}
"""exp(-x) is exactly 0 beyond these (float32 underflows below -103.98, float64 below -745.2)."""


def _exp(x: str, dtype: str, approx: bool) -> str:
    """The softmax's exp: the scalar rules' (codegen/rules.py ``_exp``: ``exp_approx`` in float32
    under either math), or under ``approx`` in float64 ``exp_approx`` on a float32 argument."""
    return _f32_call("exp_approx", x, dtype) if approx else rules_exp(x, dtype)


def generate_attention_kernel(
    low: Lowered, inputs: Sequence[str], outputs: Sequence[str], name: str, q_block: int = 0, approx: bool = False
) -> KernelSource:
    """Generate one Attention node as a flash-attention kernel.

    Args:
        low: the lowered group (one Attention node).
        inputs: the group's array inputs (q, k, v and a non-scalar mask).
        outputs: the group's outputs (the node's output).
        name: the kernel function's name.
        q_block: query rows per task (0: :data:`DEFAULT_Q_BLOCK`, more when all keys are one block
            (:data:`SCORE_BLOCK_BYTES`), fewer when that leaves threads idle).
        approx: exp as ``exp_approx``.

    Raises:
        NotFusable: anything but a lone Attention node, or dtypes / broadcasts the kernel does not run.
    """
    if len(low.nodes) != 1 or low.nodes[0].op != "Attention":
        raise NotFusable("an Attention node runs as a kernel of its own")
    node = low.nodes[0]
    attrs = {**get_op("Attention").attrs, **node.attrs}
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) == 4 else None
    (y,) = node.outputs
    vals = low.values
    dtype = vals[y].dtype
    if dtype not in ("float32", "float64") or any(vals[x].dtype != dtype for x in (q, k, v)):
        raise NotFusable("Attention needs float32 or float64 q, k, v of one dtype")
    oshape = vals[y].shape
    ob = oshape[:-2]
    Sq, Dv = oshape[-2], oshape[-1]
    Sk, D = vals[k].shape[-2], vals[k].shape[-1]
    B = int(np.prod(ob)) if ob else 1
    (bq, q_b), (bk, k_b), (bv, v_b) = (_batch_index(vals[x].shape, ob) for x in (q, k, v))
    views = {q: (bq, Sq, D), k: (bk, Sk, D), v: (bv, Sk, Dv), y: (B, Sq, Dv)}
    mask_lit = None
    m_b = "0"
    mq = mk = 1
    if mask is not None and mask in low.scalars:
        mask_lit = literal(low.scalars[mask], dtype)
        mask = None
    elif mask is not None:
        ms = align(vals[mask].shape, len(oshape))
        bm, m_b = _batch_index(ms, ob)
        mq, mk = ms[-2], ms[-1]
        views[mask] = (bm, mq, mk)
    args = [ArgSpec(x, views[x], vals[x].dtype, "in") for x in inputs]
    args.append(ArgSpec(y, views[y], dtype, "out"))
    if {a.value for a in args} != set(views):
        raise NotFusable("Attention operands must be arrays (q, k, v) and one mask")
    an = {a.value: f"a{i}" for i, a in enumerate(args)}

    kb = int(attrs.get("kv_block", 0) or 0)
    KB = Sk if kb <= 0 else min(kb, Sk)
    nkb = -(-Sk // KB)
    threads = max(1, numba.config.NUMBA_NUM_THREADS)  # a literal: keeps the kernel cacheable
    RB = q_block if q_block > 0 else DEFAULT_Q_BLOCK
    while q_block <= 0 and nkb == 1 and RB < min(MAX_Q_BLOCK, Sq) and 2 * RB * KB * np.dtype(dtype).itemsize <= SCORE_BLOCK_BYTES:
        RB *= 2
    while q_block <= 0 and RB > 16 and B * -(-Sq // RB) < 2 * threads:
        RB //= 2
    RB = min(RB, Sq)
    nqb = -(-Sq // RB)
    skip = mask is not None and nkb > 1
    item = np.dtype(dtype).itemsize
    gemm = "gemm32_ex" if dtype == "float32" else "gemm64_ex"
    T = f"np.{dtype}"
    scale = literal(float(attrs.get("scale", 1.0)), dtype)
    abs_scale = literal(abs(float(attrs.get("scale", 1.0))), dtype)
    parallel = B * nqb > 1

    def mask_at(row: str, col: str) -> str:
        if mask_lit is not None:
            return mask_lit
        if mask is None:
            return ""
        r = row if mq != 1 else "0"
        c = col if mk != 1 else "0"
        return f"{T}({an[mask]}[mbi, {r}, {c}])" if vals[mask].dtype != dtype else f"{an[mask]}[mbi, {r}, {c}]"

    L: list[str] = [
        decorator(args, parallel=parallel),
        f"def {name}({', '.join(an[a.value] for a in args)}):",
    ]
    e = L.append
    e(f"    qp = {an[q]}.ctypes.data")
    e(f"    kp = {an[k]}.ctypes.data")
    e(f"    vp = {an[v]}.ctypes.data")
    e(f"    yp = {an[y]}.ctypes.data")
    if skip:
        # The keys' half of the skip bound, once per (batch, key block) rather than once per row
        # block: max_j ||k_j|| with a margin, plus 0 * sum(V_blk), NaN when V_blk is not finite.
        e(f"    kbound = np.empty(({B}, {nkb}), dtype={T})")
        e(f"    for t in {'numba.prange' if parallel else 'range'}({B * nkb}):")
        e(f"        bi = t // {nkb}")
        e(f"        jb = t % {nkb}")
        e(f"        kbi = {k_b}")
        e(f"        vbi = {v_b}")
        e(f"        j0 = jb * {KB}")
        e(f"        nk = min({KB}, {Sk} - j0)")
        e(f"        kn = {T}(0.0)")
        e("        for j in range(nk):")
        e(f"            a = {T}(0.0)")
        e(f"            for d in range({D}):")
        e(f"                x = {an[k]}[kbi, j0 + j, d]")
        e("                a += x * x")
        e("            kn = fmaximum(kn, a)")
        e(f"        vz = {T}(0.0)")
        e("        for j in range(nk):")
        e(f"            for d in range({Dv}):")
        e(f"                vz += {an[v]}[vbi, j0 + j, d] * {T}(0.0)")
        e(f"        kbound[bi, jb] = np.sqrt(kn) * {T}(1.001) + vz")
    # Tasks take runs of (batch, row block) units, two runs per thread, and allocate their
    # scratch once per run: ViT's 8 heads of 17 rows spent 1 of 12 us allocating per unit. A
    # process with one numba thread compiles the kernel serial (common.decorator): one run.
    units = B * nqb
    per = -(-units // (2 * threads)) if parallel and threads > 1 else units
    online = nkb > 1
    width = KB + 1 if online else KB  # online: column KB carries each row's m - m' (below)
    e(f"    for t in {'numba.prange' if parallel else 'range'}({-(-units // per)}):")
    if online:
        e(f"        m = np.empty({RB}, dtype={T})")
        e(f"        l = np.empty({RB}, dtype={T})")
        e(f"        acc = np.empty(({RB}, {Dv}), dtype={T})")
    # zeros: a short last key block's unused columns hold finite values for the flat exp pass
    e(f"        s = np.zeros(({RB}, {width}), dtype={T})")
    e(f"        sf = s.reshape({RB * width})")
    e("        ws = np.empty(8, dtype=np.int32)")
    e(f"        sc = np.empty(2, dtype={T})")
    if skip:
        e(f"        qn = np.empty({RB}, dtype={T})")
    e(f"        for w in range(t * {per}, min((t + 1) * {per}, {units})):")
    e(f"            bi = w // {nqb}")
    # Row blocks in the order 0, n-1, 1, n-2, ...: a causal mask makes late blocks the expensive
    # ones, and each thread takes a contiguous range of units.
    e(f"            u = w % {nqb}")
    e(f"            rb = u // 2 if u % 2 == 0 else {nqb - 1} - u // 2")
    e(f"            r0 = rb * {RB}")
    e(f"            nr = min({RB}, {Sq} - r0)")
    e(f"            qbi = {q_b}")
    e(f"            kbi = {k_b}")
    e(f"            vbi = {v_b}")
    if mask is not None:
        e(f"            mbi = {m_b}")
    e(f"            qaddr = qp + (qbi * {Sq * D} + r0 * {D}) * {item}")
    if online:
        e("            for i in range(nr):")
        e("                m[i] = -np.inf")
        e(f"                l[i] = {T}(0.0)")
        e(f"                for c in range({Dv}):")
        e(f"                    acc[i, c] = {T}(0.0)")
    if skip:
        e("            for i in range(nr):")
        e(f"                a = {T}(0.0)")
        e(f"                for d in range({D}):")
        e(f"                    x = {an[q]}[qbi, r0 + i, d]")
        e("                    a += x * x")
        e(f"                qn[i] = np.sqrt(a) * {abs_scale}")
    e(f"            for jb in range({nkb}):")
    e(f"                j0 = jb * {KB}")
    e(f"                nk = min({KB}, {Sk} - j0)")
    if skip:
        # The skip test (module docstring): every score of the block is UNDERFLOW below the max.
        e("                kn = kbound[bi, jb]")
        e("                negligible = True")
        rows_alike = mask_lit is not None or mq == 1  # the mask's row max is the same for every row
        if rows_alike:
            e(f"                mm = {T}(-np.inf)")
            e("                for j in range(nk):")
            e(f"                    mm = fmaximum(mm, {mask_at('r0', 'j0 + j')})")
        e("                for i in range(nr):")
        if not rows_alike:
            e(f"                    mm = {T}(-np.inf)")
            e("                    for j in range(nk):")
            e(f"                        mm = fmaximum(mm, {mask_at('r0 + i', 'j0 + j')})")
        e("                    bound = mm + qn[i] * kn")
        e("                    if bound != -np.inf:  # a margin for the rounding of S, scale and mask")
        e(f"                        bound = bound + abs(bound) * {T}(1e-5)")
        e(f"                    if not (bound < m[i] - {T}({UNDERFLOW[dtype]})):")
        e("                        negligible = False")
        e("                        break")
        e("                if negligible:")
        e("                    continue")
    # S = Q_blk @ K_blk^T: column-major S^T (nk x nr) = K_blk (as stored, transposed) @ Q_blk^T.
    e(f"                {gemm}(ws, sc, 84, 78, nk, nr, {D}, kp + (kbi * {Sk * D} + j0 * {D}) * {item}, {D},"
      f" qaddr, {D}, 0.0, s.ctypes.data, {width})")
    e("                for i in range(nr):")
    e("                    mx = m[i]" if online else f"                    mx = {T}(-np.inf)")
    e("                    for j in range(nk):")
    madd = mask_at("r0 + i", "j0 + j")
    e(f"                        x = s[i, j] * {scale}" + (f" + {madd}" if madd else ""))
    e("                        s[i, j] = x")
    e("                        mx = fmaximum(mx, x)")
    # A row with no finite score yet subtracts 0: exp(-inf - 0) = 0, where exp(-inf - -inf) is NaN.
    e(f"                    base = mx if mx != -np.inf else {T}(0.0)")
    e("                    for j in range(nk):")
    e("                        s[i, j] = s[i, j] - base")
    if online:
        e(f"                    s[i, {KB}] = m[i] - base")
        e("                    m[i] = mx")
    # exp over the whole block as one flat loop: a row of a dozen keys is shorter than one
    # vector iteration (8 lanes, unrolled 4x), so a loop per row ran exp scalar (4.6 ns each;
    # 2448 of them were 11 of ViT's 21 us per attention kernel).
    e(f"                for f in range(nr * {width}):")
    e(f"                    sf[f] = {_exp('sf[f]', dtype, approx)}")
    e("                for i in range(nr):")
    e(f"                    tot = {T}(0.0)")
    e("                    for j in range(nk):")
    e("                        tot += s[i, j]")
    if online:
        e(f"                    alpha = s[i, {KB}]")
        e("                    l[i] = l[i] * alpha + tot")
        e("                    if alpha != 1.0:")
        e(f"                        for c in range({Dv}):")
        e("                            acc[i, c] *= alpha")
    else:
        # One key block: P normalised as the reference's softmax is, and P @ V written straight
        # into the output rows (no accumulator, no copy).
        e(f"                    inv = {T}(1.0) / tot")
        e("                    for j in range(nk):")
        e("                        s[i, j] = s[i, j] * inv")
    if online:
        # acc += P @ V_blk: column-major acc^T (Dv x nr) += V_blk^T (Dv x nk) @ P^T (nk x nr).
        e(f"                {gemm}(ws, sc, 78, 78, {Dv}, nr, nk, vp + (vbi * {Sk * Dv} + j0 * {Dv}) * {item}, {Dv},"
          f" s.ctypes.data, {width}, 1.0, acc.ctypes.data, {Dv})")
        e("            for i in range(nr):")
        e(f"                inv = {T}(1.0) / l[i]")
        e(f"                for c in range({Dv}):")
        e(f"                    {an[y]}[bi, r0 + i, c] = acc[i, c] * inv")
    else:
        e(f"                {gemm}(ws, sc, 78, 78, {Dv}, nr, nk, vp + (vbi * {Sk * Dv} + j0 * {Dv}) * {item}, {Dv},"
          f" s.ctypes.data, {width}, 0.0, yp + (bi * {Sq * Dv} + r0 * {Dv}) * {item}, {Dv})")
    code = "\n".join(L) + "\n"
    imports = [
        f"from fusiontune.codegen.blas import {gemm}",
        f"# fusiontune.codegen.attention version {ATTENTION_VERSION}",
    ]
    source = kernel_header(code, imports) + code
    nbytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in args)
    flops = 2 * B * Sq * Sk * (D + Dv) + 5 * B * Sq * Sk
    return KernelSource(name, source, tuple(args), "attention", nbytes, flops)
