"""A register-blocked GEMM micro-kernel written in LLVM IR, for the Conv kernels.

numba compiles loops; it does not register-block them. Its loop vectorizer turns an accumulator
array into vector loads and stores each iteration, and the SLP vectorizer that would keep a block of
accumulators in registers is off, so a numba conv loop nest tops out near half of the machine's FMA
peak (measured 60-101 GFLOP/s against OpenBLAS's 168 on one core here). This module writes the
inner block by hand, the way BLIS and onnxruntime's MLAS do: ``MR x NV`` accumulators of ``VW``
lanes live in vector registers for the whole reduction, each step loads ``NV`` vectors of the
right operand, broadcasts ``MR`` scalars of the packed left operand and issues ``MR * NV`` FMAs.

One entry point per (dtype, MR, NV), all with one signature of pointer-sized integers::

    uk(K, A, lda, sa, B, ldb, sb, C, ldc, ntaps, accumulate)

computes, for ``r < MR`` and ``j < NV * VW``::

    C[r * ldc + j] (+)= sum over t < ntaps, k < K of A[sa[t] + k * lda + r] * B[sb[t] + k * ldb + j]

``sa`` and ``sb`` are int64 arrays of element offsets, one per tap. The conv kernels
(codegen/conv.py) put the taps of a kh x kw window there, so the taps of a 3x3 conv are one
reduction of length 9 * C with the accumulators in registers throughout: one operand is the
packed weights (tap, channel, block lanes), the other the zero-padded input, each tap a shifted
view of it; a plain GEMM passes one tap at offset 0. ``accumulate != 0`` adds to C instead of
overwriting it. There is no edge case: the caller gives A ``MR`` rows and B and C ``NV * VW``
columns (padding with zeros or computing columns it then drops).

The IR is compiled once per process with llvmlite for the host CPU (its vector width: 16 float32
lanes with AVX-512, 8 with AVX2) and registered with LLVM under a fixed symbol name, so generated
kernels call it by name and stay in numba's disk cache, as codegen/blas.py does for sgemm. The
symbol name carries the vector width, so a cached kernel never calls a micro-kernel of another
shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.binding as llvm
from numba import types

_LLVM_TYPE = {"float32": "float", "float64": "double"}


def _vector_bits() -> int:
    features = llvm.get_host_cpu_features()
    if features.get("avx512f"):
        return 512
    if features.get("avx2") or features.get("avx"):
        return 256
    return 128


VECTOR_BITS = _vector_bits()
"""The widest vector register of this CPU that the micro-kernels use."""


def lanes(dtype: str) -> int:
    """Vector lanes of ``dtype`` in one register (``VW``)."""
    return VECTOR_BITS // {"float32": 32, "float64": 64}[dtype]


@dataclass(frozen=True)
class Shape:
    """A micro-kernel's register block: ``mr`` rows by ``nv`` vectors of ``vw`` lanes."""

    dtype: str
    mr: int
    nv: int

    @property
    def vw(self) -> int:
        return lanes(self.dtype)

    @property
    def nr(self) -> int:
        """Columns per block."""
        return self.nv * self.vw

    @property
    def symbol(self) -> str:
        return f"fusiontune_uk_{self.dtype}_{self.mr}x{self.nv}x{self.vw}"


def blocks() -> tuple[tuple[int, int], ...]:
    """Every (mr, nv) register block this CPU holds: ``mr * nv`` accumulators plus ``nv``
    operand vectors and a broadcast within the vector registers (32 with AVX-512, else 16),
    ``nv`` at most 4, at least 4 accumulators."""
    regs = 32 if VECTOR_BITS >= 512 else 16
    return tuple((mr, nv) for nv in range(1, 5) for mr in range(1, 15)
                 if mr * nv + nv + 1 <= regs and mr * nv >= 4)


def efficiency(mr: int, nv: int) -> float:
    """The share of the FMA peak a block reaches.

    With 32 vector registers (AVX-512), from measured GFLOP/s of the blocks on a 2-core Sapphire
    Rapids (one core, operands in L1; best 211): 18 or more accumulators 0.97-1.0, 16: 0.95, 14:
    0.91, 12: 0.81-0.88, 8: 0.69; one row (``mr = 1``, load-bound): 0.45. Two FMA ports of 4
    cycles' latency need at least 8 independent accumulators to stay busy, and more hide the
    loads.

    With 16 (AVX2), a throughput bound: a step of the reduction issues ``mr * nv`` FMAs on two
    ports, ``mr + nv`` loads (the broadcasts are loads) at :data:`LOADS_PER_CYCLE`, and takes at
    least :data:`STEP_LATENCY` cycles, the accumulators' dependency chain. Fitted inside the
    packed conv on an AMD EPYC (Zen 3) VM (each block forced on eleven dense conv shapes of
    benchmarks/bench_conv.py, one thread, 7 interleaved rounds; median time relative to the
    shape's best, corrected for padding): 6x2, 5x2 and 4x3 0.97-1.04, 14x1 0.88-0.92 (load-bound:
    15 loads for 14 FMAs), 12x1 0.85-0.88, 10x1 0.82, 3x3 0.85, 8x1, 4x2, 3x2 and 2x4 0.70-0.76 (8
    accumulators or fewer: latency-bound); the constants together with the layout costs of
    codegen/conv.py (:data:`~fusiontune.codegen.conv.LANES_EPILOGUE_16_REGISTERS`). The AVX-512
    formula ranked 13x1 and 14x1 first here."""
    if VECTOR_BITS >= 512:
        if mr == 1:
            return 0.45
        return min(1.0, 0.35 + 0.036 * mr * nv)
    fmas = mr * nv / 2
    return fmas / max(fmas, (mr + nv) / LOADS_PER_CYCLE, STEP_LATENCY)


LOADS_PER_CYCLE = 2.0
"""Loads a 16-register (AVX2) core issues per cycle alongside its FMAs (:func:`efficiency`)."""
STEP_LATENCY = 5.0
"""Cycles one step of a micro-kernel's reduction takes at least on a 16-register (AVX2) core: an
FMA's latency and the loop around it (:func:`efficiency`)."""


def _ir(s: Shape) -> str:
    """LLVM IR text of the micro-kernel for block ``s`` (see the module docstring)."""
    return _ir_function(s, s.symbol, "") + _ir_declarations(s.dtype)


def _ir_declarations(dtype: str) -> str:
    t = _LLVM_TYPE[dtype]
    vw = lanes(dtype)
    vt = f"<{vw} x {t}>"
    return "\n".join([
        f"declare {vt} @llvm.fma.v{vw}f{32 if t == 'float' else 64}({vt}, {vt}, {vt})",
        'attributes #0 = { nounwind "frame-pointer"="none" }',
    ]) + "\n"


def _ir_function(s: Shape, name: str, linkage: str) -> str:
    """The definition of ``s``'s micro-kernel as function ``name`` with ``linkage``."""
    t = _LLVM_TYPE[s.dtype]
    vt = f"<{s.vw} x {t}>"
    mr, nv, vw = s.mr, s.nv, s.vw
    accs = [(r, v) for r in range(mr) for v in range(nv)]
    zero = "zeroinitializer"
    out = [
        f"define {linkage}void @{name}(i64 %K, i64 %A, i64 %lda, i64 %sa, i64 %B, i64 %ldb, i64 %sb, i64 %C, i64 %ldc,"
        " i64 %ntaps, i64 %accumulate) #0 {",
        "entry:",
        "  %pa0 = inttoptr i64 %A to ptr",
        "  %pb0 = inttoptr i64 %B to ptr",
        "  %psa = inttoptr i64 %sa to ptr",
        "  %psb = inttoptr i64 %sb to ptr",
        "  br label %tap",
        "tap:",
        "  %t = phi i64 [0, %entry], [%t1, %tapend]",
    ]
    out += [f"  %at_{r}_{v} = phi {vt} [{zero}, %entry], [%an_{r}_{v}, %tapend]" for r, v in accs]
    out += [
        "  %sapt = getelementptr i64, ptr %psa, i64 %t",
        "  %sat = load i64, ptr %sapt, align 8",
        f"  %pat = getelementptr {t}, ptr %pa0, i64 %sat",
        "  %sbpt = getelementptr i64, ptr %psb, i64 %t",
        "  %sbt = load i64, ptr %sbpt, align 8",
        f"  %pbt = getelementptr {t}, ptr %pb0, i64 %sbt",
        "  br label %k",
        "k:",
        "  %kk = phi i64 [0, %tap], [%kk1, %k]",
        "  %pak = phi ptr [%pat, %tap], [%pak1, %k]",
        "  %pbk = phi ptr [%pbt, %tap], [%pbk1, %k]",
    ]
    out += [f"  %ak_{r}_{v} = phi {vt} [%at_{r}_{v}, %tap], [%an_{r}_{v}, %k]" for r, v in accs]
    for v in range(nv):
        out += [
            f"  %pbv_{v} = getelementptr {t}, ptr %pbk, i64 {v * vw}",
            f"  %b_{v} = load {vt}, ptr %pbv_{v}, align 4",
        ]
    for r in range(mr):
        out += [
            f"  %par_{r} = getelementptr {t}, ptr %pak, i64 {r}",
            f"  %a_{r} = load {t}, ptr %par_{r}, align 4",
            f"  %ai_{r} = insertelement {vt} poison, {t} %a_{r}, i32 0",
            f"  %as_{r} = shufflevector {vt} %ai_{r}, {vt} poison, <{vw} x i32> zeroinitializer",
        ]
        out += [
            f"  %an_{r}_{v} = call {vt} @llvm.fma.v{vw}f{32 if t == 'float' else 64}({vt} %as_{r}, {vt} %b_{v},"
            f" {vt} %ak_{r}_{v})"
            for v in range(nv)
        ]
    out += [
        f"  %pak1 = getelementptr {t}, ptr %pak, i64 %lda",
        f"  %pbk1 = getelementptr {t}, ptr %pbk, i64 %ldb",
        "  %kk1 = add i64 %kk, 1",
        "  %kmore = icmp slt i64 %kk1, %K",
        "  br i1 %kmore, label %k, label %tapend",
        "tapend:",
        "  %t1 = add i64 %t, 1",
        "  %tmore = icmp slt i64 %t1, %ntaps",
        "  br i1 %tmore, label %tap, label %done",
        "done:",
        "  %pc = inttoptr i64 %C to ptr",
        "  %acc = icmp ne i64 %accumulate, 0",
        "  br i1 %acc, label %add, label %store",
    ]
    for label, add in (("add", True), ("store", False)):
        out.append(f"{label}:")
        for r, v in accs:
            out += [
                f"  %{label}o_{r}_{v} = add i64 {v * vw}, 0",
                f"  %{label}rr_{r}_{v} = mul i64 %ldc, {r}",
                f"  %{label}off_{r}_{v} = add i64 %{label}rr_{r}_{v}, %{label}o_{r}_{v}",
                f"  %{label}p_{r}_{v} = getelementptr {t}, ptr %pc, i64 %{label}off_{r}_{v}",
            ]
            val = f"%an_{r}_{v}"
            if add:
                out += [
                    f"  %{label}c_{r}_{v} = load {vt}, ptr %{label}p_{r}_{v}, align 4",
                    f"  %{label}s_{r}_{v} = fadd {vt} %{label}c_{r}_{v}, %an_{r}_{v}",
                ]
                val = f"%{label}s_{r}_{v}"
            out.append(f"  store {vt} {val}, ptr %{label}p_{r}_{v}, align 4")
        out.append("  ret void")
    out.append("}")
    return "\n".join(out) + "\n"


def dispatcher_symbol(dtype: str) -> str:
    """The symbol of ``dtype``'s dispatching micro-kernel (:func:`dispatcher`)."""
    return f"fusiontune_ukd_{dtype}_{lanes(dtype)}"


def _dispatch_ir(dtype: str) -> str:
    """One module: every block of :func:`blocks` as an internal function, and the dispatcher that
    calls block ``which`` (an index into :func:`blocks`) with the other arguments."""
    names = [f"uk_{mr}x{nv}" for mr, nv in blocks()]
    out = [_ir_function(Shape(dtype, mr, nv), n, "internal ") for (mr, nv), n in zip(blocks(), names, strict=True)]
    params = "i64 %K, i64 %A, i64 %lda, i64 %sa, i64 %B, i64 %ldb, i64 %sb, i64 %C, i64 %ldc, i64 %ntaps, i64 %accumulate"
    cases = " ".join(f"i64 {i}, label %b{i}" for i in range(1, len(names)))
    body = [f"define void @{dispatcher_symbol(dtype)}(i64 %which, {params}) #0 {{", "entry:",
            f"  switch i64 %which, label %b0 [ {cases} ]"]
    for i, n in enumerate(names):
        body += [f"b{i}:", f"  tail call void @{n}({params})", "  ret void"]
    body.append("}")
    return "".join(out) + "\n".join(body) + "\n" + _ir_declarations(dtype)


_ENGINES: list[object] = []  # the MCJIT engines own the machine code: keep them for the process


def _jit(ir: str, symbol: str) -> None:
    """Compile ``ir`` for the host CPU, keep its engine, and register ``symbol`` with LLVM."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(ir)
    mod.verify()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=3, jit=True)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    _ENGINES.append(engine)
    llvm.add_symbol(symbol, engine.get_function_address(symbol))


@functools.cache
def register(s: Shape) -> types.ExternalFunction:
    """Compile the micro-kernel for ``s`` (once per process), register its symbol with LLVM, and
    return the numba external function that generated kernels call it through."""
    _jit(_ir(s), s.symbol)
    return types.ExternalFunction(s.symbol, types.void(*([types.intp] * 11)))


@functools.cache
def dispatcher(dtype: str) -> types.ExternalFunction:
    """Every block of ``dtype`` behind one entry point, compiled once per process (0.25 s):
    ``uk(which, K, A, lda, sa, B, ldb, sb, C, ldc, ntaps, accumulate)`` runs block
    ``blocks()[which]``.

    A conv kernel that takes its block as a runtime parameter has one source for every block, so
    the convs of a model share a few compiles (codegen/conv.py); the switch costs one
    predictable branch per call, against at least ``4 * VW`` FMAs per tap and channel.
    """
    _jit(_dispatch_ir(dtype), dispatcher_symbol(dtype))
    return types.ExternalFunction(dispatcher_symbol(dtype), types.void(*([types.intp] * 12)))


DEPTHWISE_ROWS = 8
"""Output positions the depthwise micro-kernel keeps in registers at once (:func:`depthwise`)."""


def depthwise_symbol(dtype: str) -> str:
    """The symbol of ``dtype``'s depthwise micro-kernel (:func:`depthwise`)."""
    return f"fusiontune_dwkt_{dtype}_{lanes(dtype)}"


def _depthwise_ir(dtype: str) -> str:
    """LLVM IR of the depthwise micro-kernel (:func:`depthwise`)."""
    t = _LLVM_TYPE[dtype]
    vw = lanes(dtype)
    vt = f"<{vw} x {t}>"
    rows = range(DEPTHWISE_ROWS)
    fma = f"@llvm.fma.v{vw}f{32 if t == 'float' else 64}"
    out = [
        f"define void @{depthwise_symbol(dtype)}(i64 %P, i64 %X, i64 %po, i64 %so, i64 %ntaps, i64 %W, i64 %T, i64 %ldt) #0 {{",
        "entry:",
        "  %px = inttoptr i64 %X to ptr",
        "  %ppo = inttoptr i64 %po to ptr",
        "  %pso = inttoptr i64 %so to ptr",
        "  %pw = inttoptr i64 %W to ptr",
        "  %py = inttoptr i64 %T to ptr",
        "  br label %blk",
        "blk:",
        "  %p = phi i64 [0, %entry], [%p1, %bend]",
    ]
    for r in rows:
        out += [f"  %pr_{r} = add i64 %p, {r}",
                f"  %pop_{r} = getelementptr i64, ptr %ppo, i64 %pr_{r}",
                f"  %o_{r} = load i64, ptr %pop_{r}, align 8"]
    out += ["  br label %tap", "tap:", "  %t = phi i64 [0, %blk], [%t1, %tap]"]
    out += [f"  %a_{r} = phi {vt} [zeroinitializer, %blk], [%an_{r}, %tap]" for r in rows]
    out += [
        "  %sop = getelementptr i64, ptr %pso, i64 %t",
        "  %st = load i64, ptr %sop, align 8",
        f"  %wo = mul i64 %t, {vw}",
        f"  %pwt = getelementptr {t}, ptr %pw, i64 %wo",
        f"  %w = load {vt}, ptr %pwt, align 4",
    ]
    for r in rows:
        out += [f"  %i_{r} = add i64 %o_{r}, %st",
                f"  %pxr_{r} = getelementptr {t}, ptr %px, i64 %i_{r}",
                f"  %x_{r} = load {vt}, ptr %pxr_{r}, align 4",
                f"  %an_{r} = call {vt} {fma}({vt} %w, {vt} %x_{r}, {vt} %a_{r})"]
    out += ["  %t1 = add i64 %t, 1",
            "  %tmore = icmp slt i64 %t1, %ntaps",
            "  br i1 %tmore, label %tap, label %bend",
            "bend:"]
    out += _channel_rows_store(dtype, [f"%an_{r}" for r in rows], "%p", "%py")
    out += [f"  %p1 = add i64 %p, {DEPTHWISE_ROWS}",
            "  %pmore = icmp slt i64 %p1, %P",
            "  br i1 %pmore, label %blk, label %done",
            "done:",
            "  ret void",
            "}"]
    return "\n".join(out) + "\n" + _ir_declarations(dtype)


@functools.cache
def depthwise(dtype: str) -> types.ExternalFunction:
    """The depthwise (channels-last) micro-kernel of ``dtype``, compiled once per process::

        dwk(P, X, po, so, ntaps, W, T, ldt)

    computes, for output positions ``p < P`` (``P`` a multiple of :data:`DEPTHWISE_ROWS`, at
    most ``ldt``) and the ``VW`` channels of one block (``j < VW``)::

        T[j * ldt + p] = sum over t < ntaps of W[t * VW + j] * X[po[p] + so[t] + j]

    ``X`` is a zero-padded input of one block of channels laid out (position, channel in block),
    ``po`` (``P`` int64) the element offset of each output position's window and ``so`` (``ntaps``
    int64) each tap's offset within it (the stride and dilation are in them), ``W`` the block's
    weights (tap, channel in block). :data:`DEPTHWISE_ROWS` positions are computed together: the
    tap's weight vector is loaded once for all of them, one input vector per multiply-add (numba's
    loops over the channels of a position reloaded both, and the accumulator, every tap). The
    results are stored channel by channel, as :func:`depthwise_rows` stores them.
    """
    _jit(_depthwise_ir(dtype), depthwise_symbol(dtype))
    return types.ExternalFunction(depthwise_symbol(dtype), types.void(*([types.intp] * 8)))


def _channel_rows_store(dtype: str, acc: list[str], p0: str, pt: str) -> list[str]:
    """IR that stores ``len(acc)`` positions' vectors of ``VW`` channels (``acc[r]``: position
    ``p0 + r``) channel by channel: transposed in registers (:func:`_transpose_lines`), then
    lane ``j`` of every position goes to ``T[j * ldt + p0 .. + len(acc)]``, one store of
    ``len(acc)`` lanes per channel (``%ldt`` and ``T``'s pointer ``pt`` are the caller's)."""
    t = _LLVM_TYPE[dtype]
    vw = lanes(dtype)
    vt = f"<{vw} x {t}>"
    out: list[str] = []
    for c in range(0, len(acc), vw):  # more positions than lanes (float64 on AVX2): VW at a time
        part = acc[c:c + vw]
        nr = len(part)
        tl, cols = _transpose_lines(vt, vw, part, f"tt{c}_")
        out += tl + [f"  %q{c} = add i64 {p0}, {c}"]
        for i in range(nr):
            for b in range(vw // nr):
                j = b * nr + i
                v = f"{c}_{j}"
                mask = "<" + ", ".join(f"i32 {b * nr + q}" for q in range(nr)) + ">"
                out += [f"  %v{v} = shufflevector {vt} {cols[i]}, {vt} poison, <{nr} x i32> {mask}",
                        f"  %to{v} = mul i64 %ldt, {j}",
                        f"  %ta{v} = add i64 %to{v}, %q{c}",
                        f"  %pt{v} = getelementptr {t}, ptr {pt}, i64 %ta{v}",
                        f"  store <{nr} x {t}> %v{v}, ptr %pt{v}, align 4"]
    return out


def depthwise_row_block() -> int:
    """Output positions of one output row that :func:`depthwise_rows` computes together: 8 with 32
    vector registers (8 accumulators and up to 21 input vectors of a 7-wide window at stride 2),
    4 with 16."""
    return 8 if VECTOR_BITS >= 512 else 4


def depthwise_rows_symbol(dtype: str, kw: int, sw: int, dw: int) -> str:
    """The symbol of ``dtype``'s row-blocked depthwise micro-kernel for a window ``kw`` wide at
    column stride ``sw`` and dilation ``dw`` (:func:`depthwise_rows`)."""
    return f"fusiontune_dwrt_{dtype}_{lanes(dtype)}_k{kw}s{sw}d{dw}r{depthwise_row_block()}"


def _depthwise_rows_ir(dtype: str, kw: int, sw: int, dw: int) -> str:
    """LLVM IR of the row-blocked depthwise micro-kernel (:func:`depthwise_rows`)."""
    t = _LLVM_TYPE[dtype]
    vw = lanes(dtype)
    vt = f"<{vw} x {t}>"
    nr = depthwise_row_block()
    fma = f"@llvm.fma.v{vw}f{32 if t == 'float' else 64}"
    rows = range(nr)
    cols = sorted({r * sw + k * dw for r in rows for k in range(kw)})  # the input columns a block reads
    out = [
        f"define void @{depthwise_rows_symbol(dtype, kw, sw, dw)}"
        "(i64 %OH, i64 %OW, i64 %X, i64 %rs, i64 %ks, i64 %KH, i64 %W, i64 %T, i64 %ldt) #0 {",
        "entry:",
        "  %px = inttoptr i64 %X to ptr",
        "  %pw = inttoptr i64 %W to ptr",
        "  %py = inttoptr i64 %T to ptr",
        f"  %owr = add i64 %OW, {nr - 1}",
        f"  %nb = udiv i64 %owr, {nr}",
        f"  %last = sub i64 %OW, {nr}",
        "  br label %row",
        "row:",
        "  %oh = phi i64 [0, %entry], [%oh1, %rowend]",
        "  %xr = mul i64 %oh, %rs",
        "  %yr = mul i64 %oh, %OW",
        "  br label %blk",
        "blk:",
        "  %b = phi i64 [0, %row], [%b1, %bend]",
        f"  %c0a = mul i64 %b, {nr}",
        "  %cin = icmp slt i64 %c0a, %last",
        "  %c0 = select i1 %cin, i64 %c0a, i64 %last",  # the last block overlaps the one before
        f"  %xc = mul i64 %c0, {sw * vw}",
        "  %xb = add i64 %xr, %xc",
        "  br label %kh",
        "kh:",
        "  %k = phi i64 [0, %blk], [%k1, %kh]",
    ]
    out += [f"  %a_{r} = phi {vt} [zeroinitializer, %blk], [%a{kw}_{r}, %kh]" for r in rows]
    out += ["  %kk = mul i64 %k, %ks",
            "  %xk = add i64 %xb, %kk",
            f"  %wk = mul i64 %k, {kw * vw}"]
    for j in cols:
        out += [f"  %xo_{j} = add i64 %xk, {j * vw}",
                f"  %xp_{j} = getelementptr {t}, ptr %px, i64 %xo_{j}",
                f"  %x_{j} = load {vt}, ptr %xp_{j}, align 4"]
    for k in range(kw):
        out += [f"  %wo_{k} = add i64 %wk, {k * vw}",
                f"  %wp_{k} = getelementptr {t}, ptr %pw, i64 %wo_{k}",
                f"  %w_{k} = load {vt}, ptr %wp_{k}, align 4"]
        for r in rows:
            prev = f"%a_{r}" if k == 0 else f"%a{k}_{r}"
            out.append(f"  %a{k + 1}_{r} = call {vt} {fma}({vt} %w_{k}, {vt} %x_{r * sw + k * dw}, {vt} {prev})")
    out += ["  %k1 = add i64 %k, 1",
            "  %kmore = icmp slt i64 %k1, %KH",
            "  br i1 %kmore, label %kh, label %bend",
            "bend:",
            "  %p0 = add i64 %yr, %c0"]
    out += _channel_rows_store(dtype, [f"%a{kw}_{r}" for r in rows], "%p0", "%py")
    out += ["  %b1 = add i64 %b, 1",
            "  %bmore = icmp slt i64 %b1, %nb",
            "  br i1 %bmore, label %blk, label %rowend",
            "rowend:",
            "  %oh1 = add i64 %oh, 1",
            "  %ohmore = icmp slt i64 %oh1, %OH",
            "  br i1 %ohmore, label %row, label %done",
            "done:",
            "  ret void",
            "}"]
    return "\n".join(out) + "\n" + _ir_declarations(dtype)


@functools.cache
def depthwise_rows(dtype: str, kw: int, sw: int, dw: int) -> types.ExternalFunction:
    """The row-blocked depthwise (channels-last) micro-kernel of ``dtype`` for a window ``kw``
    wide at column stride ``sw`` and dilation ``dw``, compiled once per process::

        dwr(OH, OW, X, rs, ks, KH, W, T, ldt)

    computes, for output rows ``oh < OH``, columns ``ow < OW`` (``OW`` at least
    :func:`depthwise_row_block`) and the ``VW`` channels of one block (``j < VW``)::

        T[j * ldt + oh * OW + ow] = sum over kh < KH, k < kw of
            W[(kh * kw + k) * VW + j] * X[oh * rs + kh * ks + (ow * sw + k * dw) * VW + j]

    ``X`` is the zero-padded input of one block laid out (position, channel in block), as
    :func:`depthwise`'s, ``rs`` the element offset from one output row's window to the next
    (``sh * wp * VW``), ``ks`` from one kernel row to the next (``dh * wp * VW``). Positions are
    computed :func:`depthwise_row_block` at a time along an output row, the last block of a row
    overlapping the one before it where ``OW`` is not a multiple of the block: for each kernel
    row the block's input vectors are loaded once and each serves every tap that reads it
    (``nr + kw - 1`` loads and ``kw`` weight loads for ``nr * kw`` multiply-adds at stride 1,
    where :func:`depthwise` loads one input vector per multiply-add, and is load-bound). The
    block's results are transposed in registers and stored channel by channel, ``nr`` contiguous
    positions of ``T``'s row of each (all ``VW`` rows: ``T`` holds ``VW`` rows of ``ldt``), so no
    copy out of the channels-last layout follows.
    """
    _jit(_depthwise_rows_ir(dtype, kw, sw, dw), depthwise_rows_symbol(dtype, kw, sw, dw))
    return types.ExternalFunction(depthwise_rows_symbol(dtype, kw, sw, dw), types.void(*([types.intp] * 9)))


def transpose_symbol(dtype: str) -> str:
    """The symbol of ``dtype``'s copy into the channels-last layout (:func:`transpose_in`)."""
    return f"fusiontune_dwin_{dtype}_{lanes(dtype)}"


def _transpose_lines(vt: str, vw: int, rows: list[str], tag: str) -> tuple[list[str], list[str]]:
    """IR that transposes ``vw`` vectors of ``vw`` lanes (``rows[i][k]`` -> ``out[k][i]``): log2(vw)
    rounds of ``vw`` two-vector shuffles with constant masks; the round of half-width ``h`` swaps
    the off-diagonal ``h x h`` blocks of each pair of rows ``h`` apart.

    Given ``n < vw`` rows (a power of two), the rounds from ``h = n / 2`` transpose each ``n x n``
    block of lanes in place: ``out[i]``'s lanes ``b * n .. b * n + n - 1`` are column ``b * n + i``
    (``rows[0][b * n + i], .., rows[n - 1][b * n + i]``)."""
    lines: list[str] = []
    cur = list(rows)
    n = len(rows)
    h, rnd = n // 2, 0
    while h >= 1:
        nxt = list(cur)
        for i in range(n):
            if i & h:
                continue
            lo = [k if not k & h else vw + k - h for k in range(vw)]  # A[k] | B[k - h]
            hi = [k + h if not k & h else vw + k for k in range(vw)]  # A[k + h] | B[k]
            for dst, mask in ((i, lo), (i + h, hi)):
                name = f"%{tag}{rnd}_{dst}"
                m = "<" + ", ".join(f"i32 {v}" for v in mask) + ">"
                lines.append(f"  {name} = shufflevector {vt} {cur[i]}, {vt} {cur[i + h]}, <{vw} x i32> {m}")
                nxt[dst] = name
        cur, h, rnd = nxt, h // 2, rnd + 1
    return lines, cur


def _splat(name: str, it: str, vw: int, value: str) -> list[str]:
    """IR that broadcasts the i64 ``value`` into ``%name``, a ``vw``-lane vector of type ``it``."""
    return [f"  %{name}i = insertelement {it} poison, i64 {value}, i32 0",
            f"  %{name} = shufflevector {it} %{name}i, {it} poison, <{vw} x i32> zeroinitializer"]


def _guarded_stores(vt: str, cols: list[str], bound: str, address: Callable[[int], list[str]]) -> list[str]:
    """IR that stores ``cols[i]`` while ``bound > i``, then branches to ``%next``: block ``s<i>``
    tests, block ``w<i>`` computes ``%p<i>`` with ``address(i)`` and stores."""
    out: list[str] = []
    for i, col in enumerate(cols):
        out += [f"s{i}:",
                f"  %sv{i} = icmp sgt i64 {bound}, {i}",
                f"  br i1 %sv{i}, label %w{i}, label %next",
                f"w{i}:",
                *address(i),
                f"  store {vt} {col}, ptr %p{i}, align 4",
                f"  br label %{'s' + str(i + 1) if i + 1 < len(cols) else 'next'}"]
    return out


def _transpose_ir(dtype: str) -> str:
    """LLVM IR of :func:`transpose_in`: ``VW x VW`` tiles transposed in registers."""
    t = _LLVM_TYPE[dtype]
    vw = lanes(dtype)
    vt, it, mt = f"<{vw} x {t}>", f"<{vw} x i64>", f"<{vw} x i1>"
    bits = 32 if t == "float" else 64
    mload = f"@llvm.masked.load.v{vw}f{bits}.p0"
    iota = "<" + ", ".join(f"i64 {i}" for i in range(vw)) + ">"
    sym_in = transpose_symbol(dtype)

    def to_dst(i: int) -> list[str]:  # XT + dst[q0 + i]
        return [f"  %qi{i} = add i64 %q0, {i}",
                f"  %dp{i} = getelementptr i64, ptr %pd, i64 %qi{i}",
                f"  %d{i} = load i64, ptr %dp{i}, align 8",
                f"  %p{i} = getelementptr {t}, ptr %pt, i64 %d{i}"]

    loop_end = [f"  %q1 = add i64 %q0, {vw}", "  %more = icmp slt i64 %q1, BOUND",
                "  br i1 %more, label %chunk, label %done", "done:", "  ret void", "}"]
    out = [
        # XT[dst[q] + j] = X[j * cs + q] for q < n, j < VW (0 past cw)
        f"define void @{sym_in}(i64 %n, i64 %X, i64 %cs, i64 %cw, i64 %dst, i64 %XT) #0 {{",
        "entry:",
        "  %px = inttoptr i64 %X to ptr",
        "  %pd = inttoptr i64 %dst to ptr",
        "  %pt = inttoptr i64 %XT to ptr",
        *_splat("nv", it, vw, "%n"),
        "  br label %chunk",
        "chunk:",
        "  %q0 = phi i64 [0, %entry], [%q1, %next]",
        *_splat("qv", it, vw, "%q0"),
        f"  %qk = add {it} %qv, {iota}",
        f"  %pm = icmp slt {it} %qk, %nv",
    ]
    rows = []
    for j in range(vw):
        out += [f"  %on{j} = icmp slt i64 {j}, %cw",
                f"  %mj{j} = select i1 %on{j}, {mt} %pm, {mt} zeroinitializer",
                f"  %ro{j} = mul i64 %cs, {j}",
                f"  %ra{j} = add i64 %ro{j}, %q0",
                f"  %rp{j} = getelementptr {t}, ptr %px, i64 %ra{j}",
                f"  %r{j} = call {vt} {mload}(ptr %rp{j}, i32 4, {mt} %mj{j}, {vt} zeroinitializer)"]
        rows.append(f"%r{j}")
    tl, cols = _transpose_lines(vt, vw, rows, "ti")
    out += tl + ["  %left = sub i64 %n, %q0", "  br label %s0"]
    out += _guarded_stores(vt, cols, "%left", to_dst)
    out += ["next:", *(line.replace("BOUND", "%n") for line in loop_end)]
    out += [f"declare {vt} {mload}(ptr, i32, {mt}, {vt})",
            'attributes #0 = { nounwind "frame-pointer"="none" }']
    return "\n".join(out) + "\n"


@functools.cache
def transpose_in(dtype: str) -> types.ExternalFunction:
    """The channels-last depthwise kernel's copy into a block of ``VW`` channels, as ``VW x VW``
    tiles transposed in vector registers (numba's loops copied one element at a time; masked
    vector gathers were no faster on Zen 5), compiled once per process::

        dw_in(n, X, cs, cw, dst, XT)    # XT[dst[q] + j] = X[j * cs + q], q < n, j < VW (0 past cw)

    It reads ``cw`` channel planes ``cs`` apart (NCHW) into the (position, channel) scratch,
    ``dst`` (``n`` int64) giving each input position's place there; ``n`` and ``cw`` at least 1.
    The way back needs no copy of its own: the micro-kernels store their results channel by
    channel (:func:`depthwise`, :func:`depthwise_rows`).
    """
    _jit(_transpose_ir(dtype), transpose_symbol(dtype))
    return types.ExternalFunction(transpose_symbol(dtype), types.void(*([types.intp] * 6)))


def rows_copy_symbol(dtype: str, step: int = 1) -> str:
    """The symbol of ``dtype``'s strided row copy (:func:`rows_copy`) reading every ``step``-th
    element."""
    return f"fusiontune_rows{step}_{dtype}_{lanes(dtype)}"


def _rows_copy_ir(dtype: str, step: int) -> str:
    """LLVM IR of :func:`rows_copy`: each row in vectors of ``VW`` outputs, masked loads and
    stores cutting the row's last vector. At ``step`` 2 a vector of outputs is the even lanes of
    two loaded vectors (one two-register shuffle)."""
    t = _LLVM_TYPE[dtype]
    vw = lanes(dtype)
    vt, it, mt = f"<{vw} x {t}>", f"<{vw} x i64>", f"<{vw} x i1>"
    bits = 32 if t == "float" else 64
    mload, mstore = f"@llvm.masked.load.v{vw}f{bits}.p0", f"@llvm.masked.store.v{vw}f{bits}.p0"

    def iota(start: int) -> str:
        return "<" + ", ".join(f"i64 {start + i}" for i in range(vw)) + ">"

    if step == 1:
        load = [f"  %v = call {vt} {mload}(ptr %sp, i32 4, {mt} %m, {vt} poison)"]
    elif step == 2:
        # the source elements a vector of outputs reads: 2 * (c0 + lane), lane < cols - c0; the
        # loads read up to the last of them (element 2 * (cols - 1)), not past it
        evens = "<" + ", ".join(f"i32 {2 * i}" for i in range(vw)) + ">"
        load = [*_splat("lastv", it, vw, "%last"),
                f"  %ma = icmp sle {it} {iota(0)}, %lastv",
                f"  %mb = icmp sle {it} {iota(vw)}, %lastv",
                f"  %va = call {vt} {mload}(ptr %sp, i32 4, {mt} %ma, {vt} poison)",
                f"  %spb = getelementptr {t}, ptr %sp, i64 {vw}",
                f"  %vb = call {vt} {mload}(ptr %spb, i32 4, {mt} %mb, {vt} poison)",
                f"  %v = shufflevector {vt} %va, {vt} %vb, <{vw} x i32> {evens}"]
    else:
        raise ValueError(f"rows_copy: step {step} (1 or 2)")
    return "\n".join([
        f"define void @{rows_copy_symbol(dtype, step)}(i64 %rows, i64 %cols, i64 %S, i64 %lds, i64 %D, i64 %ldd) #0 {{",
        "entry:",
        "  %ps = inttoptr i64 %S to ptr",
        "  %pd = inttoptr i64 %D to ptr",
        *_splat("cv", it, vw, "%cols"),
        "  %any = icmp sgt i64 %rows, 0",
        "  %anyc = icmp sgt i64 %cols, 0",
        "  %go = and i1 %any, %anyc",
        "  br i1 %go, label %row, label %done",
        "row:",
        "  %r = phi i64 [0, %entry], [%r1, %rowend]",
        "  %so = mul i64 %r, %lds",
        "  %do = mul i64 %r, %ldd",
        "  br label %chunk",
        "chunk:",
        "  %c0 = phi i64 [0, %row], [%c1, %chunk]",
        *_splat("c0v", it, vw, "%c0"),
        f"  %ck = add {it} %c0v, {iota(0)}",
        f"  %m = icmp slt {it} %ck, %cv",
        f"  %sc = mul i64 %c0, {step}",
        "  %sa = add i64 %so, %sc",
        "  %da = add i64 %do, %c0",
        # the last source element this vector reads, relative to its first (step 2)
        "  %rem = sub i64 %cols, %c0",
        f"  %last0 = mul i64 %rem, {step}",
        f"  %last = sub i64 %last0, {step}",
        f"  %sp = getelementptr {t}, ptr %ps, i64 %sa",
        f"  %dp = getelementptr {t}, ptr %pd, i64 %da",
        *load,
        f"  call void {mstore}({vt} %v, ptr %dp, i32 4, {mt} %m)",
        f"  %c1 = add i64 %c0, {vw}",
        "  %more = icmp slt i64 %c1, %cols",
        "  br i1 %more, label %chunk, label %rowend",
        "rowend:",
        "  %r1 = add i64 %r, 1",
        "  %rm = icmp slt i64 %r1, %rows",
        "  br i1 %rm, label %row, label %done",
        "done:",
        "  ret void",
        "}",
        f"declare {vt} {mload}(ptr, i32, {mt}, {vt})",
        f"declare void {mstore}({vt}, ptr, i32, {mt})",
        'attributes #0 = { nounwind "frame-pointer"="none" }',
    ]) + "\n"


@functools.cache
def rows_copy(dtype: str, step: int = 1) -> types.ExternalFunction:
    """A strided copy of ``rows`` rows of ``cols`` elements, every ``step``-th (1 or 2) element
    of a source row, compiled once per process::

        rcp(rows, cols, S, lds, D, ldd)    # D[r * ldd + c] = S[r * lds + c * step], r < rows, c < cols

    Each row is whole vectors of outputs, the last one masked, whatever ``cols`` is; no source
    element past a row's last one read is loaded. numba's loop over a row of a run-time width
    runs scalar below its vector loop's step (16 lanes, unrolled), and a read at stride 2 alone
    did not vectorize: the rows of 7 to 31 outputs of a small conv's grid (codegen/conv.py, the
    packed kernel's ``rows`` layout) and a strided pool's outputs read at their windows' corners
    (codegen/pool.py) were copied one element at a time."""
    _jit(_rows_copy_ir(dtype, step), rows_copy_symbol(dtype, step))
    return types.ExternalFunction(rows_copy_symbol(dtype, step), types.void(*([types.intp] * 6)))

def block_index(s: Shape) -> int:
    """``s``'s ``which`` for :func:`dispatcher`."""
    return blocks().index((s.mr, s.nv))


def assembly(s: Shape) -> str:
    """The machine code of ``s``'s micro-kernel as assembly text (to check the register blocking)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(_ir(s))
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=3)
    return tm.emit_assembly(mod)
