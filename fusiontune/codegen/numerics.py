"""Scalar numerics for generated kernels: vectorizable approximations and low-precision rounding.

Two schedule keys of a fused group use these functions (codegen/rules.py writes the calls):

* ``math="approx"``: exp, tanh, sigmoid and erf as polynomial / rational approximations (a float32
  kernel's exp is :func:`exp_approx` under the default math too: within one ulp of the correctly
  rounded exp; its erf is :func:`erf_1ulp`). numba
  from PyPI has no SVML, so ``np.exp`` / ``np.tanh`` / ``math.erf`` stay calls to libm and keep
  every loop that makes them scalar. The functions below use only ``+ - * /``, selects, ``floor``
  and a float <-> int bitcast, so once LLVM inlines them into a kernel's loop it vectorizes the
  loop (8 or 16 lanes). Their worst errors, measured on dense grids against float64
  (tests/codegen/test_numerics.py), are the ``*_MAX_*`` constants.
* ``precision="float16"|"bfloat16"``: MindSpore's enable_low_precision, emulated bit-exactly in
  float32. :func:`round_float16` and :func:`round_bfloat16` return the float32 holding exactly the
  float16 / bfloat16 nearest to their argument (round to nearest even, subnormals, overflow to
  inf, NaN kept); a loop-nest kernel rounds every value it loads, computes and stores.

Why the functions carry their own fast-math flags: generated kernels are compiled with
``fastmath={'reassoc', 'contract'}``, and reassociation would be free to rewrite ``(x + c) - c``
(the float16 subnormal rounding) into ``x``, or to fold the two Cody-Waite steps of exp's range
reduction into one. Each function here is compiled on its own, eagerly for float32, with no
fast-math flag (the rounding) or only ``contract`` (the approximations: fused multiply-adds in
the polynomials are faster and no less accurate). LLVM keeps per-instruction flags when it
inlines a function into a kernel, so a kernel's ``reassoc`` never reaches these instructions; a
test checks the results inside a reassoc kernel bit for bit against direct calls.

Caching: numba's disk cache of a kernel does not look at the functions it calls, so a change
here would leave stale machine code behind. :data:`NUMERICS_VERSION` hashes this file, and every
kernel source that imports from it carries that hash in a comment (codegen/common.py), so the
kernel cache key changes with this file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from fusiontune.codegen.target import target_features

NUMERICS_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
"""A short hash of this file's source; generated kernels that call into it quote it."""

# Worst errors against float64, measured over EVERY float32 of the range named (the constants
# leave 5-10% headroom; tests/codegen/test_numerics.py checks them on dense grids). Relative errors
# are over normal float32 results; below FLT_MIN (exp(x) for x < -87.34) exp's absolute error is at
# most one subnormal spacing, 2^-149. Measured on x86-64 with FMA, which 'contract' uses in the
# polynomials; without FMA the errors differ (tanh reached 3.9e-7 on a sample).
EXP_MAX_REL = 9.0e-8  # measured 8.46e-8 (at x = 26.6904), x in [-87.34, 88.72]
TANH_MAX_ABS = 3.1e-7  # measured 2.92e-7 (at x = 5.12604), x in [-10, 10] (+-1 beyond)
ERF_MAX_ABS = 4.7e-7  # measured 4.42e-7 (at x = 3.90084), x in [-6, 6] (+-1 beyond)
SIGMOID_MAX_REL = 1.6e-7  # measured 1.48e-7 (at x = -16.6362), x in [-87.3, 88]

APPROX_FUNCTIONS = ("exp_approx", "tanh_approx", "sigmoid_approx", "erf_approx")
EXACT_FUNCTIONS = ("exp_f32", "tanh_f32", "erf_f32")
ROUND_FUNCTIONS = ("round_float16", "round_bfloat16")


# ---- bit casts -------------------------------------------------------------------------------
@intrinsic
def float_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """The bits of a float32 as an int32 (an LLVM bitcast: free, and vectorizable)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def bits_float(typingctx, b):  # type: ignore[no-untyped-def]
    """The float32 whose bits are the int32 ``b`` (other integer types are truncated to 32 bits)."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def bits_double(typingctx, b):  # type: ignore[no-untyped-def]
    """The float64 whose bits are the int64 ``b``."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = context.cast(builder, args[0], sig.args[0], types.int64)
        return builder.bitcast(v, ir.DoubleType())

    return types.float64(b), codegen


def _ldexp_vectorizes() -> bool:
    """Whether the target numba compiles for has AVX-512F, where LLVM turns a loop's ``llvm.ldexp``
    into ``vscalefps`` (one instruction per 16 lanes). Without it the vectorized ``llvm.ldexp``
    becomes a libm ``ldexpf`` call per lane. A CPU name forced without features counts as without."""
    features = target_features()
    return features is not None and "avx512f" in features


LDEXP_VECTORIZES = _ldexp_vectorizes()
"""See :func:`_ldexp_vectorizes`; :func:`times_pow2` reads it when a function using it compiles."""


@intrinsic
def times_pow2(typingctx, y, n):  # type: ignore[no-untyped-def]
    """``y * 2^n`` for a float32 ``y`` and an int32 ``n`` in [-150, 128], rounded once, subnormal
    and overflowing results included (exp's scale).

    With AVX-512 (:data:`LDEXP_VECTORIZES`) it is ``llvm.ldexp``, which a vectorized loop runs as
    ``vscalefps``: SiLU under ``math="approx"`` 0.250 -> 0.227 ns per element on one Zen 5 core
    (64k elements, a 16-lane loop; 0.196 with :func:`exp_approx`'s selects cut as well).
    Elsewhere it is two products by exponent-bit powers of two, ``2^(n >> 1)`` and
    ``2^(n - (n >> 1))``, each a normal float over that range (rounded once too: the first
    product is exact), which vectorize on any x86 target.
    """
    if y != types.float32 or not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f32, i32 = ir.FloatType(), ir.IntType(32)
        v, e = args[0], context.cast(builder, args[1], sig.args[1], types.int32)
        if LDEXP_VECTORIZES:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, i32]), "llvm.ldexp.f32.i32")
            return builder.call(fn, [v, e])
        half = builder.ashr(e, i32(1))
        for part in (half, builder.sub(e, half)):
            bits = builder.shl(builder.add(part, i32(127)), i32(23))
            v = builder.fmul(v, builder.bitcast(bits, f32))
        return v

    return types.float32(types.float32, n), codegen


def _ieee_minmax(which: str):  # type: ignore[no-untyped-def]
    """An intrinsic calling ``llvm.<which>`` (``maximum`` / ``minimum``) on two floats of one type."""

    def typer(typingctx, a, b):  # type: ignore[no-untyped-def]
        if not isinstance(a, types.Float) or a != b:
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            t = context.get_value_type(sig.args[0])
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t]), f"llvm.{which}.f{sig.args[0].bitwidth}")
            return builder.call(fn, args)

        return a(a, a), codegen

    typer.__name__ = typer.__qualname__ = f"f{which}"  # distinct names for numba's templates
    return typer


fmaximum = intrinsic(_ieee_minmax("maximum"))
fmaximum.__doc__ = """IEEE 754-2019 maximum of two floats of one type (``llvm.maximum``): NaN if either is NaN.

ReduceMax accumulates with it (codegen/rules.py). LLVM vectorizes a reduction over
``llvm.maximum`` without fast-math flags, while the compare-and-select ``v if v > acc else acc``
stays scalar unless the select carries ``nnan`` and ``nsz`` (numba puts flags on arithmetic
only): 5x faster on a 4 MiB row-max, and NaN propagates by itself.
"""
fminimum = intrinsic(_ieee_minmax("minimum"))
fminimum.__doc__ = """IEEE 754-2019 minimum of two floats of one type (``llvm.minimum``): NaN if either is NaN."""


@intrinsic
def arith_fence(typingctx, x):  # type: ignore[no-untyped-def]
    """``x`` unchanged, as a barrier to fast-math rewrites (``llvm.arithmetic.fence``).

    Loop-nest kernels wrap each per-row value (computed once, outside the inner loops) in it.
    Under ``reassoc`` LLVM otherwise rewrites ``v * (1 / s)`` in a loop, the reciprocal
    being hoisted and used once, into ``v / s``: a division per element (a softmax's scaling, a
    LayerNorm's ``* rstd``), 5 cycles per 8 lanes against 0.5 for the product, and the reference's
    rounding (a product by the rounded reciprocal) lost as well. It costs nothing at run time.
    """
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        t = context.get_value_type(sig.args[0])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t]), f"llvm.arithmetic.fence.f{sig.args[0].bitwidth}")
        return builder.call(fn, args)

    return x(x), codegen


@intrinsic
def opaque(typingctx, n):  # type: ignore[no-untyped-def]
    """``n`` as an int64 whose value LLVM cannot see: an empty inline-asm copy (``llvm`` keeps
    it, it costs one register move at most, and it is hoisted out of loops like any pure value).

    Generated kernels write an outer loop's literal trip count through it, ``range(opaque(28))``,
    so that LLVM does not unroll the loop whole. A loop of a literal count around a vectorized
    inner loop was unrolled into that many copies of the vector loop and its remainder and
    alias checks: nothing faster at run time, and 5 to 15 s of compile per kernel (ShuffleNet's
    grouped 1x1 convs 13 s each, against 2 s with the outer counts opaque; the same run time).
    Inner loops keep their literal counts where unrolling them is what makes them fast.
    """
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = context.cast(builder, args[0], sig.args[0], types.int64)
        i64 = ir.IntType(64)
        return builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [v], side_effect=False)

    return types.int64(n), codegen


# The fast-math flags of the approximations (fused multiply-adds only) and of the roundings (none):
# see the module docstring.
_APPROX_FASTMATH = {"contract"}
_F32 = np.float32
_I32 = np.int32

# ---- exp -------------------------------------------------------------------------------------
_EXP_LO = _F32(-104.0)  # below: exp(x) < 2^-150 rounds to 0
_EXP_CLAMP = _F32(88.8)  # above 88.72 exp overflows; up to 128.5 ln2, n = 128 and the scaled polynomial is inf
_LOG2E = _F32(1.44269504088896341)
_LN2_HI = _F32(0.693359375)  # Cody-Waite: n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = _F32(-2.12194440e-4)


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def exp_approx(x):  # type: ignore[no-untyped-def]
    """exp(x) for float32 (Cephes expf): relative error below :data:`EXP_MAX_REL`.

    ``x = n ln2 + r`` with ``n = floor(x log2(e) + 1/2)`` and ``|r| <= ln2 / 2`` (two-constant
    Cody-Waite reduction, so ``r`` keeps its low bits), ``exp(r)`` by a degree-6 polynomial, times
    ``2^n`` by :func:`times_pow2` (results down to the subnormals come out right). x > 88.72 gives inf,
    x < -104 gives 0 (so a softmax's ``-inf`` masks give exactly 0), NaN stays NaN.
    Float64 kernels call it on float32 arguments: float32 accuracy.
    """
    # Above _EXP_CLAMP the result overflows to inf by itself (n = 128); NaN goes through llvm.minimum
    # and the arithmetic. Lanes at or below _EXP_LO get a harmless argument: their result is
    # replaced by the last select anyway, and clamping them to _EXP_LO made the scale multiply
    # underflow, a microcode assist of ~100 cycles on x86 (a softmax with -1e4 on 10% of its keys
    # ran 7x slower). The three selects this replaced (a clamp at 88.72, inf above it, NaN kept)
    # cost a SiLU 0.227 -> 0.196 ns per element (one Zen 5 core, AVX-512).
    xc = fminimum(x, _EXP_CLAMP)
    xc = _F32(0.0) if xc <= _EXP_LO else xc
    fn = np.floor(xc * _LOG2E + _F32(0.5))
    r = xc - fn * _LN2_HI
    r = r - fn * _LN2_LO
    z = r * r
    p = _F32(1.9875691500e-4)
    p = p * r + _F32(1.3981999507e-3)
    p = p * r + _F32(8.3334519073e-3)
    p = p * r + _F32(4.1665795894e-2)
    p = p * r + _F32(1.6666665459e-1)
    p = p * r + _F32(5.0000001201e-1)
    y = p * z + r + _F32(1.0)
    y = times_pow2(y, np.int32(fn))
    return _F32(0.0) if x <= _EXP_LO else y


# ---- exp, tanh and erf of float32, correctly rounded in practice (tanh and erf: the default math;
# exp_f32 was the default exp until 2026-11-28, exp_approx is now: codegen/rules.py _exp) ---------
# numba from PyPI calls libm's expf / tanhf one element at a time. These compute in float64 with
# an error near 1e-14 relative and round once to float32: the float32 nearest the true value
# except within 1e-14 of a tie between two floats, as libm's own float32 functions (which also
# work in double) do. They use only arithmetic, floor, selects and a bitcast, so a loop calling
# them vectorizes (8 float64 lanes per 512-bit register). Checked against float64 numpy on dense
# grids (tests/codegen/test_numerics.py): equal to the rounded float64 value everywhere sampled.
_D_EXP_HI = 89.0  # exp(89) > FLT_MAX: rounds to inf
_D_EXP_LO = -104.0  # exp(-104) < FLT_TRUE_MIN / 2: rounds to 0
_D_LOG2E = 1.4426950408889634
_D_LN2_HI = 0.6931471803691238  # ln2 with its low 20 bits cleared: n * _D_LN2_HI is exact
_D_LN2_LO = 1.9082149292705877e-10


@numba.njit("float64(float64)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def exp_d(x):  # type: ignore[no-untyped-def]
    """exp(x) for float64 ``x`` in [-104, 89] (clamped there), relative error about 1e-15:
    ``x = n ln2 + r``, ``|r| <= ln2 / 2`` (Cody-Waite in two parts), Taylor to degree 11 (its
    remainder is below 7e-15), times ``2^n`` from exponent bits. NaN gives NaN: the clamps are
    ``llvm.minimum`` / ``llvm.maximum``, which keep it, and so carry it through without a select
    (a select for NaN after the arithmetic kept a caller's loop from vectorizing)."""
    xc = fmaximum(fminimum(x, _D_EXP_HI), _D_EXP_LO)
    fn = np.floor(xc * _D_LOG2E + 0.5)
    r = (xc - fn * _D_LN2_HI) - fn * _D_LN2_LO
    p = 2.505210838544172e-08  # 1/11!
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.755731922398589e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 0.0001984126984126984
    p = p * r + 0.001388888888888889
    p = p * r + 0.008333333333333333
    p = p * r + 0.041666666666666664
    p = p * r + 0.16666666666666666
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    return p * bits_double((np.int64(fn) + 1023) << 52)


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def exp_f32(x):  # type: ignore[no-untyped-def]
    """exp(x) of a float32, rounded once from float64: inf above 88.72, 0 below -103.97,
    subnormal results rounded as the hardware rounds float64 to float32, NaN kept."""
    return np.float32(exp_d(np.float64(x)))


_D_TANH_SMALL = 1.0 / 256.0  # below: the odd series to x^9 (remainder below 2e-20 relative)


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def tanh_f32(x):  # type: ignore[no-untyped-def]
    """tanh(x) of a float32, rounded once from float64: ``(1 - e) / (1 + e)`` with
    ``e = exp(-2|x|)`` (cancellation costs at most 1e-13 relative above 1/256), the series
    ``x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835`` below; the sign restored, +-1 beyond,
    NaN kept."""
    xd = np.float64(x)
    a = np.abs(xd)
    e = exp_d(-2.0 * fminimum(a, 20.0))
    big = (1.0 - e) / (1.0 + e)
    a2 = a * a
    small = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0)))))
    t = small if a < _D_TANH_SMALL else big  # NaN takes big, NaN through exp_d
    return np.float32(np.copysign(t, xd))


# erf in float64: two polynomials, interpolated at the Chebyshev nodes of their interval from
# 40-digit mpmath values and converted to powers of the interval's [-1, 1] variable (a
# well-conditioned conversion here: every coefficient is below 1). Below 1, erf(x) / x as a
# polynomial of degree 10 in x^2 (relative error 5.5e-16 against mpmath); from 1 to 4,
# erfcx(x) = exp(x^2) erfc(x) as one of degree 20 in x (relative error 4.2e-15), and
# erf = 1 - exp(-x^2) erfcx(x) (erfc is below 0.16 there: absolute error below 1e-15).
_D_ERF_SMALL = 1.0  # below: the Taylor series; from here to the clamp: 1 - exp(-x^2) erfcx(x)
_D_ERF_CLAMP = 4.0  # erf(4) = 1 - 1.5e-8 rounds to 1 in float32, as erf of anything beyond


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH, forceinline=True)
def erf_f32(x):  # type: ignore[no-untyped-def]
    """erf(x) of a float32, rounded once from float64 (relative error near 1e-15 before the
    rounding): ``x P(x^2)`` below 1, ``1 - exp(-x^2) Q(x)`` from 1 to 4 (``x^2`` is exact: a
    float32 squared fits a float64), +-1 beyond; the sign restored, NaN kept.

    Both branches are computed and one selected, so a loop calling it vectorizes, and it is
    ``forceinline``: at about 60 instructions LLVM's inliner would otherwise leave it a call, and
    the caller's loop scalar (8.7 ns per element, libm's ``erff`` 8.9, inlined 1.2 with 8 float64
    lanes). Inlining by LLVM, not by numba, keeps its flags apart from the kernel's (module docstring).
    """
    xd = np.float64(x)
    a = fminimum(np.abs(xd), _D_ERF_CLAMP)  # NaN stays NaN
    s = a * a
    u = s + s - 1.0  # [0, 1] -> [-1, 1]
    p = 9.207614215658363e-12
    p = p * u + -2.0456997595543134e-10
    p = p * u + 4.11576058992764e-09
    p = p * u + -7.511464577090118e-08
    p = p * u + 1.2233827558562044e-06
    p = p * u + -1.7537169899206237e-05
    p = p * u + 0.00021751715603847516
    p = p * u + -0.0022854855610623184
    p = p * u + 0.019852496688983864
    p = p * u + -0.14053608902272122
    p = p * u + 0.9654687386698673
    t = (a - 2.5) * (2.0 / 3.0)  # [1, 4] -> [-1, 1]
    q = 2.5395574884830492e-09
    q = q * t + -8.084231033249293e-09
    q = q * t + 1.2029302171698742e-08
    q = q * t + -3.593325839269299e-08
    q = q * t + 1.3530198325470135e-07
    q = q * t + -3.9788605258713253e-07
    q = q * t + 1.111538574950877e-06
    q = q * t + -3.138273541371801e-06
    q = q * t + 8.712502403441536e-06
    q = q * t + -2.3614016169873686e-05
    q = q * t + 6.257900179179341e-05
    q = q * t + -0.00016201037133522968
    q = q * t + 0.00040908491246424244
    q = q * t + -0.0010058316963059736
    q = q * t + 0.0024036476783987457
    q = q * t + -0.005570706154054586
    q = q * t + 0.012489373879841054
    q = q * t + -0.02700529666574668
    q = q * t + 0.05611049344497322
    q = q * t + -0.11152102018467626
    q = q * t + 0.2108063640611436
    y = a * p if a < _D_ERF_SMALL else 1.0 - exp_d(-s) * q  # NaN takes the second, NaN through exp_d
    return np.float32(np.copysign(y, xd))


# ---- tanh ------------------------------------------------------------------------------------
# Eigen's clamp for FMA targets: the smallest x where the rational function (evaluated with fused
# multiply-adds, as 'contract' gives here) reaches exactly 1, so tanh(+-inf) = +-1.
_TANH_CLAMP = _F32(7.99881172180175781)
_TANH_TINY = _F32(0.0004)  # below it tanh(x) = x in float32


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def tanh_approx(x):  # type: ignore[no-untyped-def]
    """tanh(x) for float32 (Eigen's generic_fast_tanh_float): absolute error below :data:`TANH_MAX_ABS`.

    A 13/6-degree odd/even rational function on x clamped to about [-8, 8], where it reaches +-1;
    ``tanh(x) = x`` for ``|x| < 0.0004``. NaN stays NaN.
    """
    c = x if x < _TANH_CLAMP else _TANH_CLAMP
    c = c if c > -_TANH_CLAMP else -_TANH_CLAMP
    x2 = c * c
    p = _F32(-2.76076847742355e-16)
    p = p * x2 + _F32(2.00018790482477e-13)
    p = p * x2 + _F32(-8.60467152213735e-11)
    p = p * x2 + _F32(5.12229709037114e-08)
    p = p * x2 + _F32(1.48572235717979e-05)
    p = p * x2 + _F32(6.37261928875436e-04)
    p = p * x2 + _F32(4.89352455891786e-03)
    p = p * c
    q = _F32(1.19825839466702e-06)
    q = q * x2 + _F32(1.18534705686654e-04)
    q = q * x2 + _F32(2.26843463243900e-03)
    q = q * x2 + _F32(4.89352518554385e-03)
    y = p / q
    # Without FMA (another rounding of the polynomials) the function may pass 1 just below the
    # clamp, which was chosen for FMA: keep |tanh| <= 1 on any target.
    y = y if y < _F32(1.0) else _F32(1.0)
    y = y if y > _F32(-1.0) else _F32(-1.0)
    ax = x if x >= _F32(0.0) else -x
    y = x if ax < _TANH_TINY else y
    return y if x == x else x


# ---- sigmoid ---------------------------------------------------------------------------------
@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def sigmoid_approx(x):  # type: ignore[no-untyped-def]
    """1 / (1 + exp(-x)) with :func:`exp_approx`: relative error below :data:`SIGMOID_MAX_REL`."""
    return _F32(1.0) / (_F32(1.0) + exp_approx(-x))


# ---- erf within one ulp, in float32 (the default math's erf) ------------------------------------
_ERF1_SPLIT = _F32(1.25)  # below: erf(a) = a + a R(a^2); from here: 1 - exp(-a^2) erfcx(a)
_ERF1_CLAMP = _F32(4.0)  # erf(+-4) rounds to +-1 in float32


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH, forceinline=True)
def erf_1ulp(x):  # type: ignore[no-untyped-def]
    """erf(x) of a float32 in float32 arithmetic, within one ulp of the correctly rounded value.

    Below 1.25, ``a + a R(a^2)`` with ``R = erf(a) / a - 1`` a degree-7 polynomial (absolute
    error 9e-10; the sum keeps the relative accuracy near 0, where an absolute error bound, as
    :func:`erf_approx`'s, is many ulps). From 1.25 to 4, ``1 - exp(-a^2) erfcx(a)``, erfcx a
    degree-12 polynomial (relative error 1.5e-9), ``a^2`` carried as a rounded square plus its
    exact remainder (a fused multiply-add) so that exp's argument loses nothing, exp by
    :func:`exp_approx`. Coefficients: Chebyshev fits to scipy's float64 erf and erfcx, rounded to
    float32. Beyond 4, +-1; the sign restored; NaN kept. tests/codegen/test_numerics.py checks
    it against the rounded float64 erf on a dense grid: at most one ulp apart (2.7% of 20 million
    points one ulp off), the largest error 1.3 ulp. Both branches are computed and one selected,
    and it is ``forceinline``, so a loop calling it vectorizes (16 float32 lanes): an erf GELU
    0.44 ns an element on one Zen 5 core, against 1.19 for :func:`erf_f32` (float64, rounded
    once) and 0.25 for :func:`erf_approx`.
    """
    a = np.abs(x)
    s = a * a
    u = s * _F32(1.2799999713897705) - _F32(1.0)  # [0, 1.5625] -> [-1, 1]
    p = _F32(-1.3552162272389978e-06)
    p = p * u + _F32(1.421708020643564e-05)
    p = p * u + _F32(-0.00012914816034026444)
    p = p * u + _F32(0.0010343525791540742)
    p = p * u + _F32(-0.007047492079436779)
    p = p * u + _F32(0.03998836502432823)
    p = p * u + _F32(-0.18785153329372406)
    p = p * u + _F32(-0.10768730193376541)
    small = a + a * p
    b = fminimum(a, _ERF1_CLAMP)  # NaN stays NaN
    hi = b * b
    lo = b * b - hi  # the square's rounding error, exactly (contracted into a fused multiply-add)
    e = exp_approx(-hi)
    e = e - e * lo  # exp(-hi - lo), lo below half an ulp of hi
    t = b * _F32(0.7272727489471436) - _F32(1.9090908765792847)  # [1.25, 4] -> [-1, 1]
    q = _F32(3.0127805530355545e-06)
    q = q * t + _F32(-9.000739737530239e-06)
    q = q * t + _F32(1.7254742488148622e-05)
    q = q * t + _F32(-5.0251608627149835e-05)
    q = q * t + _F32(0.00015305211127270013)
    q = q * t + _F32(-0.00042079671402461827)
    q = q * t + _F32(0.0011204873444512486)
    q = q * t + _F32(-0.0029139514081180096)
    q = q * t + _F32(0.007342839147895575)
    q = q * t + _F32(-0.0178721621632576)
    q = q * t + _F32(0.041886985301971436)
    q = q * t + _F32(-0.09414556622505188)
    q = q * t + _F32(0.20188754796981812)
    big = _F32(1.0) - e * q
    y = small if a < _ERF1_SPLIT else big  # NaN takes big, NaN through fminimum
    return np.copysign(y, x)


# ---- erf -------------------------------------------------------------------------------------
_ERF_CLAMP = _F32(4.0)  # erf(+-4) rounds to +-1 in float32


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=_APPROX_FASTMATH)
def erf_approx(x):  # type: ignore[no-untyped-def]
    """erf(x) for float32 (Eigen's 13/8-degree generic_fast_erf_float): absolute error below :data:`ERF_MAX_ABS`.

    x is clamped to [-4, 4], outside of which erf rounds to +-1, and the result to [-1, 1].
    NaN stays NaN.
    """
    c = x if x < _ERF_CLAMP else _ERF_CLAMP
    c = c if c > -_ERF_CLAMP else -_ERF_CLAMP
    x2 = c * c
    p = _F32(-2.72614225801306e-10)
    p = p * x2 + _F32(2.77068142495902e-08)
    p = p * x2 + _F32(-2.10102402082508e-06)
    p = p * x2 + _F32(-5.69250639462346e-05)
    p = p * x2 + _F32(-7.34990630326855e-04)
    p = p * x2 + _F32(-2.95459980854025e-03)
    p = p * x2 + _F32(-1.60960333262415e-02)
    p = p * c
    q = _F32(-1.45660718464996e-05)
    q = q * x2 + _F32(-2.13374055278905e-04)
    q = q * x2 + _F32(-1.68282697438203e-03)
    q = q * x2 + _F32(-7.37332916720468e-03)
    q = q * x2 + _F32(-1.42647390514189e-02)
    y = p / q
    # Near the clamp the rational function passes 1 (by up to 4e-7): keep |erf| <= 1.
    y = y if y < _F32(1.0) else _F32(1.0)
    y = y if y > _F32(-1.0) else _F32(-1.0)
    return y if x == x else x


# ---- low precision ---------------------------------------------------------------------------
_ABS = _I32(0x7FFFFFFF)
_SIGN = _I32(-0x80000000)  # 0x80000000 as an int32
_INF_BITS = _I32(0x7F800000)
_F16_OVERFLOW = _I32(0x477FF000)  # 65520: the midpoint between float16's max 65504 and 2^16
_F16_MIN_NORMAL = _I32(0x38800000)  # 2^-14
_F16_KEEP = _I32(-0x2000)  # 0xFFFFE000: the sign, exponent and top 10 mantissa bits
_F16_SUBNORMAL_SHIFTER = _F32(0.5)  # its float32 ulp is 2^-24, float16's subnormal spacing


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=False)
def round_float16(x):  # type: ignore[no-untyped-def]
    """The float32 equal to ``x`` rounded to float16 (round to nearest even), bit-exact.

    Normal float16 range: round the float32 bits to 10 mantissa bits (add ``0xFFF`` plus the
    lowest kept bit, then mask: a carry into the exponent is the right answer). Subnormal range
    (``|x| < 2^-14``): ``(|x| + 0.5) - 0.5`` rounds to a multiple of 2^-24 in the FPU's own
    round-to-nearest-even (exact in strict float32, hence no fast-math flags here).
    ``|x| >= 65520`` gives inf with the sign of x; NaN stays NaN; the sign of zero is kept.
    """
    b = float_bits(x)
    a = np.int32(b & _ABS)
    sign = np.int32(b & _SIGN)
    # np.int32(...): numba widens int32 arithmetic to int64; truncating lets LLVM keep 32-bit lanes.
    normal = np.int32((a + _I32(0x0FFF) + ((a >> 13) & _I32(1))) & _F16_KEEP)
    ax = bits_float(a)
    sub = float_bits((ax + _F16_SUBNORMAL_SHIFTER) - _F16_SUBNORMAL_SHIFTER)
    r = normal if a >= _F16_MIN_NORMAL else sub
    r = r if a < _F16_OVERFLOW else _INF_BITS
    y = bits_float(np.int32(r | sign))
    return y if x == x else x


_BF16_KEEP = _I32(-0x10000)  # 0xFFFF0000
_QUIET = _I32(0x00400000)


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy", fastmath=False)
def round_bfloat16(x):  # type: ignore[no-untyped-def]
    """The float32 equal to ``x`` rounded to bfloat16 (round to nearest even), bit-exact.

    bfloat16 is float32's upper half: round the bits to 16 (add ``0x7FFF`` plus the lowest kept
    bit, then mask); overflow carries into inf by itself, subnormals need nothing special. A NaN
    keeps its sign and upper payload with the quiet bit set, so it stays a NaN after truncation.
    """
    b = float_bits(x)
    r = (b + _I32(0x7FFF) + ((b >> 16) & _I32(1))) & _BF16_KEEP
    nan = (b | _QUIET) & _BF16_KEEP
    return bits_float(r) if x == x else bits_float(nan)


# ---- whole arrays, for tests and emulations ---------------------------------------------------
# One loop per function, chosen by an index outside the loops: a dispatcher passed as an argument
# would make numba's disk cache miss in every new process.
@numba.njit("void(int64, float32[::1], float32[::1])", cache=True, nogil=True, error_model="numpy")
def _map(which, x, out):  # type: ignore[no-untyped-def]
    n = x.size
    if which == 0:
        for i in range(n):
            out[i] = exp_approx(x[i])
    elif which == 1:
        for i in range(n):
            out[i] = tanh_approx(x[i])
    elif which == 2:
        for i in range(n):
            out[i] = sigmoid_approx(x[i])
    elif which == 3:
        for i in range(n):
            out[i] = erf_approx(x[i])
    elif which == 4:
        for i in range(n):
            out[i] = round_float16(x[i])
    elif which == 6:
        for i in range(n):
            out[i] = exp_f32(x[i])
    elif which == 7:
        for i in range(n):
            out[i] = tanh_f32(x[i])
    elif which == 8:
        for i in range(n):
            out[i] = erf_f32(x[i])
    elif which == 9:
        for i in range(n):
            out[i] = erf_1ulp(x[i])
    else:
        for i in range(n):
            out[i] = round_bfloat16(x[i])


def apply(name: str, x: np.ndarray) -> np.ndarray:
    """One of this module's scalar functions (by name) applied to every element of ``x``, as float32."""
    names = (*APPROX_FUNCTIONS, *ROUND_FUNCTIONS, *EXACT_FUNCTIONS, "erf_1ulp")
    if name not in names:
        raise ValueError(f"no scalar function {name!r} in fusiontune.codegen.numerics ({', '.join(names)})")
    arr = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(arr)
    _map(names.index(name), arr.reshape(-1), out.reshape(-1))
    return out
