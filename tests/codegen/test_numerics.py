"""codegen/numerics.py and the two schedule keys that use it: ``math="approx"`` and ``precision``.

* Each approximation against float64 numpy / scipy on dense grids with edges (0, tiny, huge, +-inf,
  NaN, the under- and overflow of exp); the bounds are numerics' declared ``*_MAX_*`` constants,
  set just above the measured worst errors, so a weaker approximation (a lower-degree polynomial)
  fails here.
* ``round_float16`` / ``round_bfloat16`` bit for bit against numpy's float16 and ml_dtypes'
  bfloat16 over a sweep of float32 bit patterns across the whole range, every value of the low
  precision type, its exact midpoints (ties) and their float32 neighbours, and the boundaries.
* Kernels: with ``math="approx"`` softmax, GELU (erf and tanh), sigmoid, SiLU, tanh, erf and exp
  match the float64 interpreter within bounds derived from the declared ones (and, for a lone
  function, bit for bit the direct call: the kernel's ``reassoc`` does not reach into the
  functions); with ``precision`` a loop nest equals a numpy emulation that rounds after every op;
  contraction kernels take ``math`` in their epilogue and ignore ``precision``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from scipy import special

from fusiontune.codegen import kernel_source, numerics
from fusiontune.codegen.numerics import (
    ERF_MAX_ABS,
    EXP_MAX_REL,
    NUMERICS_VERSION,
    SIGMOID_MAX_REL,
    TANH_MAX_ABS,
    apply,
)
from fusiontune.codegen.rules import NUMERICS_FUNCTIONS
from fusiontune.ir import Graph, GraphBuilder, Tensor, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program

F32 = np.float32
U = 2.0**-24  # the unit roundoff of float32
TINY = float(np.finfo(F32).tiny)  # the smallest normal float32
SUBNORMAL = 2.0**-149
SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, -1e-30, TINY, -TINY, 1e-7, -1e-7, 1.0, -1.0,
                     1e30, -1e30, 3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan], dtype=F32)


def _bits_sweep(step: int, lo: float = 0.0, hi: float = float("inf")) -> np.ndarray:
    """Every ``step``-th float32 of either sign with ``lo <= |x| <= hi`` (by bit pattern: dense
    in every binade), plus :data:`SPECIALS`."""
    a, b = (int(np.array(v, dtype=F32).view(np.uint32)) for v in (lo, hi))
    mags = (np.arange(a, b + 1, step, dtype=np.int64)).astype(np.uint32).view(F32)
    return np.concatenate([mags, -mags, SPECIALS])


def _grid(lo: float, hi: float, n: int) -> np.ndarray:
    return np.linspace(lo, hi, n, dtype=np.float64).astype(F32)


def _as64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


# ---- the approximations against float64 -------------------------------------------------------
def test_exp_approx_within_declared_relative_error() -> None:
    x = np.concatenate([_bits_sweep(97, hi=110.0), _grid(-88.0, 89.0, 1_000_001)])
    with np.errstate(over="ignore"):
        got, want = _as64(apply("exp_approx", x)), np.exp(_as64(x))
    fmax = float(np.finfo(F32).max)
    normal = (want >= TINY) & (want <= fmax)
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() <= EXP_MAX_REL, f"max relative error {rel.max():.3g} at x={x[normal][rel.argmax()]}"
    under = want < TINY  # subnormal results and gradual underflow to 0, within one subnormal
    assert np.abs(got[under] - want[under]).max() <= SUBNORMAL
    assert np.all(np.isposinf(got[want > fmax]))  # float32 overflow (x > 88.7228): inf
    assert np.all(got[x < -104.0] == 0.0)  # exactly 0: softmax masks of -inf give exact zeros
    assert np.isnan(got[np.isnan(x)]).all()
    assert apply("exp_approx", np.array([0.0, -np.inf], F32)).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("ldexp", [True, False], ids=["llvm.ldexp", "exponent-bits"])
def test_times_pow2_rounds_once_on_both_targets(monkeypatch: pytest.MonkeyPatch, ldexp: bool) -> None:
    """exp's scale ``y * 2^n``, as llvm.ldexp (AVX-512) and as two exponent-bit products (elsewhere),
    compiled in a vectorized loop: both equal the float64 product rounded once to float32, over
    exp's whole range of n, subnormal, zero and inf results included."""
    import numba

    monkeypatch.setattr(numerics, "LDEXP_VECTORIZES", ldexp)

    @numba.njit("void(float32[::1], int32[::1], float32[::1])", nogil=True, error_model="numpy")
    def scale(y, n, out):  # type: ignore[no-untyped-def]
        for i in range(y.size):
            out[numba.uint64(i)] = numerics.times_pow2(y[numba.uint64(i)], n[numba.uint64(i)])

    rng = np.random.default_rng(3)
    n = np.repeat(np.arange(-150, 129, dtype=np.int32), 400)
    y = rng.uniform(0.70, 1.42, n.size).astype(F32)  # exp(r) for |r| <= ln2 / 2
    y[:3] = [np.nan, 1.0, 0.0]
    out = np.empty_like(y)
    scale(y, n, out)
    with np.errstate(over="ignore"):
        want = (y.astype(np.float64) * np.ldexp(1.0, n.astype(np.int64))).astype(F32)
    np.testing.assert_array_equal(out, want)
    assert np.isposinf(out).any() and (out == 0.0).any() and ((out > 0) & (out < TINY)).any()
    asm = scale.inspect_asm(scale.signatures[0])
    assert "vscalefps" in asm if ldexp and numerics._ldexp_vectorizes() else "vscalefps" not in asm


def test_tanh_approx_within_declared_absolute_error() -> None:
    x = np.concatenate([_bits_sweep(97, hi=12.0), _grid(-9.0, 9.0, 1_000_001)])
    got, want = apply("tanh_approx", x), np.tanh(_as64(x))
    err = np.abs(_as64(got) - want)
    finite = ~np.isnan(x)
    assert err[finite].max() <= TANH_MAX_ABS, f"max error {err[finite].max():.3g} at x={x[finite][err[finite].argmax()]}"
    assert np.abs(got[finite]).max() <= 1.0
    np.testing.assert_array_equal(apply("tanh_approx", -x[finite]), -got[finite])  # odd, exactly
    tiny = np.abs(x) < 4e-4
    np.testing.assert_array_equal(got[tiny], x[tiny])  # tanh(x) = x in float32 near 0
    assert apply("tanh_approx", np.array([np.inf, -np.inf], F32)).tolist() == [1.0, -1.0]
    assert np.isnan(got[np.isnan(x)]).all()


def test_erf_approx_within_declared_absolute_error() -> None:
    x = np.concatenate([_bits_sweep(97, hi=8.0), _grid(-4.5, 4.5, 1_000_001)])
    got, want = apply("erf_approx", x), special.erf(_as64(x))
    err = np.abs(_as64(got) - want)
    finite = ~np.isnan(x)
    assert err[finite].max() <= ERF_MAX_ABS, f"max error {err[finite].max():.3g} at x={x[finite][err[finite].argmax()]}"
    assert np.abs(got[finite]).max() <= 1.0
    np.testing.assert_array_equal(apply("erf_approx", -x[finite]), -got[finite])
    assert apply("erf_approx", np.array([np.inf, -np.inf, 0.0], F32)).tolist() == [1.0, -1.0, 0.0]
    assert np.isnan(got[np.isnan(x)]).all()


def test_sigmoid_approx_within_declared_relative_error() -> None:
    x = np.concatenate([_bits_sweep(97, hi=110.0), _grid(-88.0, 40.0, 1_000_001)])
    got, want = _as64(apply("sigmoid_approx", x)), special.expit(_as64(x))
    normal = want >= TINY
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() <= SIGMOID_MAX_REL, f"max relative error {rel.max():.3g} at x={x[normal][rel.argmax()]}"
    assert np.abs(got[~normal & ~np.isnan(x)] - want[~normal & ~np.isnan(x)]).max() <= TINY
    assert apply("sigmoid_approx", np.array([np.inf, -np.inf, 0.0], F32)).tolist() == [1.0, 0.0, 0.5]
    assert np.isnan(got[np.isnan(x)]).all()


# ---- the default math's exp, tanh and erf: float64 inside, rounded once ----------------------------
@pytest.mark.parametrize("name,ref,lo,hi", [("exp_f32", np.exp, -110.0, 95.0), ("tanh_f32", np.tanh, -12.0, 12.0),
                                            ("erf_f32", special.erf, -6.0, 6.0)])
def test_default_exp_tanh_and_erf_are_float64_rounded_once(name: str, ref: Callable[[np.ndarray], np.ndarray],
                                                       lo: float, hi: float) -> None:
    """Equal to numpy's float64 result rounded to float32 everywhere on a dense sweep (tiny,
    subnormal and overflowing results, signed zeros, infinities and NaN included), but for at
    most 1 in a million values, by one ulp: a near-tie that float64's own error can flip."""
    x = np.concatenate([_bits_sweep(997, hi=hi), _grid(lo, hi, 2_000_001)])
    got = apply(name, x)
    with np.errstate(over="ignore", under="ignore"):
        want = ref(_as64(x)).astype(F32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    gb, wb = got[~nan].view(np.int32).astype(np.int64), want[~nan].view(np.int32).astype(np.int64)
    off = gb != wb
    assert off.sum() <= x.size // 1_000_000, f"{off.sum()} values differ, e.g. x={x[~nan][off][:5]}"
    assert np.abs(gb - wb).max() <= 1


def test_erf_1ulp_is_within_one_ulp_of_the_rounded_float64_erf() -> None:
    """The default math's float32 erf: at most one ulp from the correctly rounded erf on a dense
    grid across both branches (and their seam at 1.25) and the clamp, tiny and subnormal
    arguments exactly as erf's first term gives them, odd, +-1 at +-inf, NaN kept."""
    x = np.concatenate([_grid(-4.5, 4.5, 4_000_001), _grid(1.2, 1.3, 200_001), _bits_sweep(97, hi=6.0),
                        -_bits_sweep(89, hi=6.0)])
    got = apply("erf_1ulp", x)
    want = special.erf(_as64(x)).astype(F32)
    fin = ~np.isnan(x)
    gb, wb = got[fin].view(np.int32).astype(np.int64), want[fin].view(np.int32).astype(np.int64)
    assert np.abs(gb - wb).max() <= 1, f"x={x[fin][np.abs(gb - wb).argmax()]}"
    assert np.count_nonzero(gb != wb) < 0.05 * gb.size
    np.testing.assert_array_equal(apply("erf_1ulp", -x[fin]), -got[fin])
    assert apply("erf_1ulp", np.array([np.inf, -np.inf, 0.0], F32)).tolist() == [1.0, -1.0, 0.0]
    assert np.isnan(apply("erf_1ulp", np.array([np.nan], F32))).all()


@pytest.mark.parametrize("op", ["Gelu", "Erf", "Sigmoid", "Tanh"])
def test_default_math_inlines_and_vectorizes(op: str) -> None:
    """A float32 loop over the default math's functions vectorizes: no call is left (erf_f32 is
    too large for LLVM's inliner without ``forceinline``: the loop then stayed scalar, as slow
    as libm; LLVM's own intrinsics, ``llvm.ldexp`` among them, are instructions) and the
    arithmetic inside runs on vectors: float64 for tanh, float32 for exp (sigmoid) and erf."""
    import re

    g = GraphBuilder(f"default_{op}")
    x = g.input("x", (8, 256))
    g.output({"Gelu": g.gelu, "Erf": g.erf, "Sigmoid": g.sigmoid, "Tanh": g.tanh}[op](x))
    src = kernel_source(g.build(), [n.name for n in g.build().nodes])
    namespace: dict[str, object] = {}
    exec(src.source.replace("cache=True", "cache=False"), namespace)  # a fresh compile: its IR
    llvm = "\n".join(namespace[src.name].inspect_llvm().values())  # type: ignore[attr-defined]
    assert not re.search(r"call [^\n]*@(?!llvm\.)\S*(numerics|erf|exp|tanh)", llvm), "a call to the math is left in the loop"
    lanes = "double" if op == "Tanh" else "float"
    assert re.search(rf"fmul[^\n]*<\d+ x {lanes}>", llvm), "the loop did not vectorize"


# ---- rounding to float16 / bfloat16, bit for bit ---------------------------------------------------
def _assert_same_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float32
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)  # a NaN stays a NaN (payloads may differ)
    bad = got.view(np.uint32)[~nan] != want.view(np.uint32)[~nan]
    if bad.any():
        i = np.flatnonzero(bad)[:5]
        pytest.fail(f"{bad.sum()} mismatches, e.g. x={x[~nan][i]} got={got[~nan][i]} want={want[~nan][i]}")


def _sweep_all_bits(step: int) -> np.ndarray:
    """Every ``step``-th float32 bit pattern over the whole range (both signs, inf, NaNs)."""
    return (np.arange(-(-(1 << 32) // step), dtype=np.uint32) * np.uint32(step)).view(F32)


def _ties_and_neighbours(values: np.ndarray) -> np.ndarray:
    """The float32 midpoints between consecutive finite ``values`` (exact: the low-precision
    types have at most 11 significant bits), one float32 ulp either side of each, and ``values``."""
    v = np.unique(values[np.isfinite(values)].astype(np.float64))
    mid = ((v[:-1] + v[1:]) / 2).astype(F32)
    return np.concatenate([values, mid, np.nextafter(mid, F32(np.inf)), np.nextafter(mid, F32(-np.inf))])


def _f16_reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(F32)


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return x.astype(ml_dtypes.bfloat16).astype(F32)


F16_EDGES = np.array(
    [65504.0, 65519.996, 65520.0, 65536.0, 1e5, 2.0**-14, np.nextafter(F32(2.0**-14), F32(0)),
     2.0**-24, 2.0**-25, np.nextafter(F32(2.0**-25), F32(1)), 3 * 2.0**-25, 2.0**-26, 1e-40,
     1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2049.0, 2051.0],
    dtype=F32,
)
# bfloat16: the tie above its max (0x7F7F8000, odd -> inf), FLT_MAX, and float32 subnormal ties
BF16_EDGES = np.array([0x7F7F8000, 0x7F7F7FFF, 0x7F7FFFFF, 0x7F7E8000, 0x00008000, 0x00018000, 0x00007FFF,
                       0x00800000, 0x007F8000, 0x3F808000, 0x3F818000], dtype=np.uint32).view(F32)
NAN_PATTERNS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF],
                        dtype=np.uint32).view(F32)


def test_round_float16_bit_exact_on_a_sweep_of_every_97th_float32() -> None:
    x = _sweep_all_bits(97)  # 44 million values, every binade, NaNs and infinities included
    _assert_same_bits(apply("round_float16", x), _f16_reference(x), x)


def test_round_float16_bit_exact_on_every_float16_its_ties_and_edges() -> None:
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    x = np.concatenate([_ties_and_neighbours(every), F16_EDGES, -F16_EDGES, SPECIALS, NAN_PATTERNS])
    got = apply("round_float16", x)
    _assert_same_bits(got, _f16_reference(x), x)
    # every float16 is its own rounding; 65520 (the tie above 65504) overflows to inf
    finite = np.isfinite(every)
    _assert_same_bits(apply("round_float16", every[finite]), every[finite], every[finite])
    assert apply("round_float16", np.array([65520.0, -65520.0, 65519.996], F32)).tolist() == [np.inf, -np.inf, 65504.0]


def test_round_bfloat16_bit_exact_on_a_sweep_of_every_97th_float32() -> None:
    x = _sweep_all_bits(97)
    _assert_same_bits(apply("round_bfloat16", x), _bf16_reference(x), x)


def test_round_bfloat16_bit_exact_on_every_bfloat16_its_ties_and_edges() -> None:
    every = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(F32)
    x = np.concatenate([_ties_and_neighbours(every), BF16_EDGES, -BF16_EDGES, F16_EDGES, SPECIALS, NAN_PATTERNS])
    _assert_same_bits(apply("round_bfloat16", x), _bf16_reference(x), x)
    finite = np.isfinite(every)
    _assert_same_bits(apply("round_bfloat16", every[finite]), every[finite], every[finite])


# ---- kernels: math="approx" ------------------------------------------------------------------------
def _build(fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], dtype: str = "float32") -> Graph:
    g = GraphBuilder("numerics", dtype=dtype)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def _run(graph: Graph, schedule: Mapping[str, str], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All of ``graph`` as one kernel under ``schedule``."""
    group = Group("all", tuple(n.name for n in graph.nodes), schedule=dict(schedule))
    prog = build_program(FusedGraph.singletons(graph).with_groups([group]))
    assert prog.kernel_count == 1
    return {k: np.array(v, copy=True) for k, v in prog.run(inputs).items()}


def _x(shape: tuple[int, ...], seed: int, scale: float = 4.0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)
    x.reshape(-1)[:10] = [0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0, 95.0, -95.0, np.inf, -np.inf]
    return x


# Bounds on |kernel - float64| for one element, from the declared errors. The extra multiples of
# U are the float32 roundings around the call: the argument's (bounded through the derivative:
# |t f'(t)| <= 0.5 for erf and tanh here) and the arithmetic after it.
def _gelu_bound(x: np.ndarray, f_max_abs: float, roundings: int) -> np.ndarray:
    """0.5 x (1 + f(t)): f's absolute error and ``roundings`` float32 roundings, scaled by 0.5 |x|."""
    return 0.5 * np.abs(x) * (f_max_abs + roundings * U)


UNARY: dict[str, tuple[Callable[[GraphBuilder, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "exp": (lambda g, x: g.exp(x), lambda x, ref: EXP_MAX_REL * np.abs(ref) + SUBNORMAL),
    "tanh": (lambda g, x: g.tanh(x), lambda x, ref: np.full_like(ref, TANH_MAX_ABS)),
    "erf": (lambda g, x: g.erf(x), lambda x, ref: np.full_like(ref, ERF_MAX_ABS)),
    "sigmoid": (lambda g, x: g.sigmoid(x), lambda x, ref: np.maximum(SIGMOID_MAX_REL * np.abs(ref), TINY)),
    # x / (1 + e): exp's relative error passes at most whole, plus the add's and the divide's
    "silu": (lambda g, x: g.silu(x), lambda x, ref: (EXP_MAX_REL + 2 * U) * np.abs(ref) + TINY),
    "gelu": (lambda g, x: g.gelu(x), lambda x, ref: _gelu_bound(x, ERF_MAX_ABS, 6)),
    "gelu_tanh": (lambda g, x: g.gelu(x, approximate="tanh"), lambda x, ref: _gelu_bound(x, TANH_MAX_ABS, 8)),
}


@pytest.fixture(scope="module")
def unary_kernel() -> tuple[Graph, dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """One elementwise kernel computing every op of :data:`UNARY` from one input, math=approx."""
    def fn(g: GraphBuilder) -> tuple[Tensor, ...]:
        x = g.input("x", (48, 129))
        return tuple(make(g, x) for make, _ in UNARY.values())

    graph = _build(fn)
    x = _x((48, 129), seed=1)
    return graph, _run(graph, {"math": "approx"}, {"x": x}), run_graph(graph, {"x": x}), x


@pytest.mark.parametrize("op", list(UNARY))
def test_approx_kernel_matches_float64_within_declared_bounds(op: str, unary_kernel: tuple) -> None:
    graph, got, ref, x = unary_kernel
    name = graph.outputs[list(UNARY).index(op)]
    g, r = got[name].astype(np.float64), ref[name]
    with np.errstate(over="ignore"):
        r32 = r.astype(F32)
    finite = np.isfinite(r32)
    np.testing.assert_array_equal(g[~finite], r32[~finite])  # +-inf and overflow: exact
    err, bound = np.abs(g[finite] - r[finite]), UNARY[op][1](_as64(x[finite]), r[finite])
    assert np.all(err <= bound), f"{op}: worst error / bound {np.max(err / np.maximum(bound, 1e-300)):.3g}"


@pytest.mark.parametrize("op", ["exp", "tanh", "erf", "sigmoid"])
def test_functions_inside_a_reassoc_kernel_equal_direct_calls_bit_for_bit(op: str, unary_kernel: tuple) -> None:
    """Kernels run with fastmath reassoc + contract; the inlined functions keep their own flags."""
    graph, got, _, x = unary_kernel
    name = graph.outputs[list(UNARY).index(op)]
    np.testing.assert_array_equal(got[name].view(np.uint32), apply(f"{op}_approx", x).view(np.uint32))


def test_approx_softmax_matches_float64_and_masks_give_exact_zeros() -> None:
    graph = _build(lambda g: g.softmax(g.input("x", (33, 300))))
    x = _x((33, 300), seed=2, scale=6.0)
    x[:, 1:] = np.where(np.isinf(x[:, 1:]), 0.0, x[:, 1:])  # +inf would make a NaN row in both
    x[0, 0] = 0.0
    x[5:9, 100:250] = -np.inf  # masked positions
    got = _run(graph, {"math": "approx"}, {"x": x})[graph.outputs[0]].astype(np.float64)
    ref = run_graph(graph, {"x": x})[graph.outputs[0]]
    assert np.all(got[5:9, 100:250] == 0.0)
    # exp's error twice (the term and the sum), the rounding of x - max scaled by |x - max|
    # (d exp(t) / exp(t) = dt), and the roundings of the sum, reciprocal and product
    spread = np.abs(_as64(x) - _as64(x).max(axis=-1, keepdims=True))
    spread[np.isinf(spread)] = 0.0
    bound = (2 * EXP_MAX_REL + U * (spread + 48)) * ref + SUBNORMAL
    assert np.all(np.abs(got - ref) <= bound), f"worst error / bound {np.max(np.abs(got - ref) / bound):.3g}"


def test_float64_kernel_with_approx_computes_in_float32() -> None:
    graph = _build(lambda g: g.gelu(g.input("x", (16, 40))), dtype="float64")
    x = _x((16, 40), seed=3).astype(np.float64)
    got = _run(graph, {"math": "approx"}, {"x": x})[graph.outputs[0]]
    ref = run_graph(graph, {"x": x})[graph.outputs[0]]
    assert got.dtype == np.float64
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(got[~finite], ref[~finite])
    err = np.abs(got[finite] - ref[finite])
    assert np.all(err <= _gelu_bound(x[finite], ERF_MAX_ABS, 6))
    assert err.max() > 1e-12  # float32 accuracy, not float64's


def test_approx_sources_call_no_libm_and_carry_the_numerics_version() -> None:
    def fn(g: GraphBuilder) -> tuple[Tensor, ...]:
        x = g.input("x", (4, 8))
        return (*(make(g, x) for make, _ in UNARY.values()), g.softmax(x))

    graph = _build(fn)
    nodes = [n.name for n in graph.nodes]
    libm = kernel_source(graph, nodes).source
    src = kernel_source(graph, nodes, {"math": "approx"}).source
    # the default math: exp and erf in float32 within one ulp, tanh in float64
    assert "exp_approx(" in libm and "erf_1ulp(" in libm and "tanh_f32(" in libm
    assert "exp_f32(" not in libm and "erf_f32(" not in libm
    for call in ("np.exp(", "np.tanh(", "math.erf(", "exp_f32(", "tanh_f32(", "erf_f32(", "erf_1ulp("):
        assert call not in src
    assert f"# fusiontune.codegen.numerics version {NUMERICS_VERSION}" in src
    assert "from fusiontune.codegen.numerics import" in src


def test_numerics_version_hashes_the_module_source() -> None:
    text = Path(numerics.__file__).read_bytes()
    assert NUMERICS_VERSION == hashlib.sha256(text).hexdigest()[:12]
    assert all(callable(getattr(numerics, f)) for f in NUMERICS_FUNCTIONS)


def test_kernels_without_numerics_keep_the_plain_header() -> None:
    graph = _build(lambda g: g.add(g.mul(g.input("x", (4, 8)), 2.0), 1.0))
    src = kernel_source(graph, [n.name for n in graph.nodes], {"math": "approx"}).source
    assert src.startswith("import math\nimport numpy as np\nimport numba\n\n\n@numba.njit")


def test_contraction_epilogue_takes_math_and_ignores_precision() -> None:
    w = (np.random.default_rng(4).standard_normal((16, 24)) * 0.5).astype(F32)

    def fn(g: GraphBuilder) -> Tensor:
        return g.gelu(g.matmul(g.input("a", (40, 16)), g.const(w)))

    graph = _build(fn)
    nodes = [n.name for n in graph.nodes]
    plain = kernel_source(graph, nodes)
    approx = kernel_source(graph, nodes, {"math": "approx"})
    assert approx.kind == "contraction"
    assert "erf_1ulp(" in plain.source and "erf_1ulp(" not in approx.source and "erf_approx(" in approx.source
    assert kernel_source(graph, nodes, {"precision": "float16"}).source == plain.source
    assert kernel_source(graph, nodes, {"math": "approx", "precision": "bfloat16"}).source == approx.source
    a = np.random.default_rng(5).standard_normal((40, 16)).astype(F32)
    got = _run(graph, {"math": "approx"}, {"a": a})[graph.outputs[0]].astype(np.float64)
    ref = run_graph(graph, {"a": a})[graph.outputs[0]]
    y = _as64(a) @ _as64(w)
    # the product's own float32 error (K = 16 terms) passes through gelu' (|gelu'| < 1.13)
    bound = _gelu_bound(y, ERF_MAX_ABS, 6) + 1.13 * 16 * U * (np.abs(_as64(a)) @ np.abs(_as64(w)))
    assert np.all(np.abs(got - ref) <= bound)


@pytest.mark.parametrize("schedule", [{"math": "fast"}, {"precision": "float8"}])
def test_unknown_schedule_values_are_refused(schedule: dict[str, str]) -> None:
    graph = _build(lambda g: g.exp(g.input("x", (2, 3))))
    with pytest.raises(ValueError, match="schedule"):
        kernel_source(graph, [n.name for n in graph.nodes], schedule)


# ---- kernels: precision="float16" / "bfloat16" --------------------------------------------------
def _f16(a: np.ndarray) -> np.ndarray:
    return _f16_reference(np.asarray(a, dtype=F32))


def _bf16(a: np.ndarray) -> np.ndarray:
    return _bf16_reference(np.asarray(a, dtype=F32))


def _chain(g: GraphBuilder) -> Tensor:
    """(x + y) * 0.3 - y, then exp: every op's result rounded in low precision."""
    x, y = g.input("x", (40, 130)), g.input("y", (40, 130))
    return g.exp(g.sub(g.mul(g.add(x, y), 0.3), y))


def _chain_emulation(x: np.ndarray, y: np.ndarray, r: Callable[[np.ndarray], np.ndarray], exp: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The same chain in float32 numpy, rounding with ``r`` after every op (and every load)."""
    xr, yr, c = r(x), r(y), r(np.array(0.3, F32))
    return r(exp(r(r(r(xr + yr) * c) - yr)))


def _ulps16(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of float16 spacing at ``want`` (2^-24 below the normal range)."""
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(want.astype(np.float64))))
    spacing = 2.0 ** np.maximum(e - 10, -24)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.fixture(scope="module")
def chain_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(6)
    return {"x": rng.standard_normal((40, 130)).astype(F32) * 3, "y": rng.standard_normal((40, 130)).astype(F32)}


def test_float16_chain_with_approx_equals_the_emulation_bit_for_bit(chain_inputs: dict[str, np.ndarray]) -> None:
    graph = _build(_chain)
    got = _run(graph, {"precision": "float16", "math": "approx"}, chain_inputs)[graph.outputs[0]]
    want = _chain_emulation(chain_inputs["x"], chain_inputs["y"], _f16, lambda m: apply("exp_approx", m))
    # Bit-exact: no fused multiply-add can span two ops, since a rounding call sits between them.
    _assert_same_bits(got, want, chain_inputs["x"])


def test_float16_chain_with_libm_exp_is_within_one_float16_ulp(chain_inputs: dict[str, np.ndarray]) -> None:
    graph = _build(_chain)
    got = _run(graph, {"precision": "float16"}, chain_inputs)[graph.outputs[0]]
    # numba's expf (libm) and float64 exp rounded may differ by a float32 ulp, which crosses a
    # float16 rounding boundary now and then: one float16 ulp, never more.
    want = _chain_emulation(chain_inputs["x"], chain_inputs["y"], _f16, lambda m: np.exp(_as64(m)).astype(F32))
    np.testing.assert_array_equal(_f16(got).view(np.uint32), got.view(np.uint32))  # float16 values
    assert _ulps16(got, want).max() <= 1.0


def test_bfloat16_chain_equals_the_emulation_and_moves_results_by_about_2_to_the_minus_8(chain_inputs: dict[str, np.ndarray]) -> None:
    graph = _build(_chain)
    got = _run(graph, {"precision": "bfloat16", "math": "approx"}, chain_inputs)[graph.outputs[0]]
    want = _chain_emulation(chain_inputs["x"], chain_inputs["y"], _bf16, lambda m: apply("exp_approx", m))
    _assert_same_bits(got, want, chain_inputs["x"])
    full = _run(graph, {"math": "approx"}, chain_inputs)[graph.outputs[0]]
    rel = np.abs(_as64(got) - _as64(full)) / np.abs(_as64(full))
    # bfloat16 keeps 8 significant bits: each rounding moves a value by up to 2^-9 relative, and
    # the argument of exp carries its absolute error into exp's relative error.
    assert 2.0**-10 < np.median(rel) < 2.0**-6 and rel.max() < 2.0**-2


def test_float16_softmax_rounds_every_stage(chain_inputs: dict[str, np.ndarray]) -> None:
    graph = _build(lambda g: g.softmax(g.input("x", (40, 130))))
    x = chain_inputs["x"]
    got = _run(graph, {"precision": "float16", "math": "approx"}, {"x": x})[graph.outputs[0]]
    xr = _f16(x)
    e = _f16(apply("exp_approx", _f16(xr - xr.max(axis=-1, keepdims=True))))
    s = _f16(e.sum(axis=-1, keepdims=True, dtype=F32))  # accumulated in float32, then rounded
    want = _f16(e * _f16(F32(1.0) / s))
    np.testing.assert_array_equal(_f16(got).view(np.uint32), got.view(np.uint32))
    # The kernel sums in another order (vectorized), so the float32 sum may differ in its last
    # bits and, after rounding, by a float16 ulp: the result moves by at most 2 float16 ulps.
    assert _ulps16(got, want).max() <= 2.0
    assert np.mean(got == want) > 0.95


def test_low_precision_leaves_integers_alone_and_rounds_their_float_casts() -> None:
    def fn(g: GraphBuilder) -> Tensor:
        i = g.input("i", (6,), dtype="int32")
        return g.add(g.cast(g.add(i, g.const(np.array(1, np.int32))), "float32"), 0.0)

    graph = _build(fn)
    i = np.array([2048, 2, 65518, 70000, -5000, 0], dtype=np.int32)
    got = _run(graph, {"precision": "float16"}, {"i": i})[graph.outputs[0]]
    # 2048 + 1 stays the int32 2049; its cast 2049.0 rounds to 2048 in float16 (a tie, to even),
    # 65519 to 65504, 70001 overflows, -4999 rounds to -5000 (spacing 4)
    np.testing.assert_array_equal(got, [2048.0, 3.0, 65504.0, np.inf, -5000.0, 1.0])
