"""Codegen rules: how each op of the catalogue becomes numba code.

Every op has exactly one rule, found by :func:`rule_kind`:

* ``scalar``: an elementwise op, written as a scalar expression over its operands' local
  variables (``SCALAR_RULES``); the loop-nest generator puts it inside the loops.
* ``reduce``: a reduction, written as an accumulator (``REDUCE_RULES``).
* ``expand``: a fused normalization, lowered through its primitive expansion (ir/expand.py).
* ``contraction``: MatMul and Conv, a BLAS call (or, for a thin Conv, a loop nest) per block
  with the epilogue applied in cache (codegen/contraction.py, codegen/conv.py).
* ``window``: MaxPool / AveragePool, a sliding-window kernel of its own (codegen/pool.py).
* ``layout``: a data-movement kernel of its own (codegen/layout.py).
* ``attention``: the fused Attention op, a flash-attention kernel of its own (codegen/attention.py),
  and its backward AttentionGrad (codegen/attention_grad.py).
* ``opaque``: a fused op with a kernel of its own that nothing fuses into (RotaryPositionEmbedding,
  codegen/rotary.py).

``tests/codegen/test_op_rules.py`` walks the catalogue and fails when an op has no rule.

Two schedule keys change what the scalar rules write (:func:`scalar_expr`, :func:`round_expr`):
``math="approx"`` swaps the tanh (float64 inside) and erf (float32, within one ulp) of Tanh, Erf,
Gelu, GeGlu, GeluCdf and GeluGrad for the float32 approximations of codegen/numerics.py
(``APPROX_RULES``), which have absolute error bounds; exp (so Exp, Sigmoid, Silu, SwiGlu, softmax)
is numerics' float32 ``exp_approx``, within one ulp, under either math (:func:`_exp`). ``precision="float16"|"bfloat16"`` has the
loop-nest generator wrap values in the rounding functions of the same module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fusiontune.ir.expand import EXPANDABLE

Lit = Callable[[float], str]
ScalarRule = Callable[[list[str], Mapping[str, Any], Lit, str], str]


def literal(value: float, dtype: str) -> str:
    """A literal of ``dtype`` in generated code (float32 literals stay float32 under numba)."""
    if dtype == "bool":
        return "True" if value else "False"
    if dtype.startswith("int"):
        return f"np.{dtype}({int(value)})"
    v = float(value)
    if np.isnan(v):
        text = "np.nan"
    elif np.isinf(v):
        text = "np.inf" if v > 0 else "-np.inf"
    else:
        text = repr(v)
    return f"np.{dtype}({text})"


def _pow(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    return f"({a[0]} ** {a[1]})"


def _cast(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    to = str(np.dtype(attrs["to"]))
    if to == "bool":
        return f"({a[0]} != 0)"
    return f"np.{to}({a[0]})"


def _gelu(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str, approx: bool = False) -> str:
    """``x * GeluCdf(x)``: the gate's factor 1/2 is exact, so this rounds as ``x/2 * (1 + erf)``."""
    return f"({a[0]} * {_gelu_cdf(a[0], attrs, lit, dtype, approx)})"


def _f32_call(fn: str, x: str, dtype: str) -> str:
    """A call of a float32 function of codegen/numerics.py; a float64 kernel converts around it."""
    if dtype == "float32":
        return f"{fn}({x})"
    return f"np.{dtype}({fn}(np.float32({x})))"


def _exp(x: str, dtype: str) -> str:
    """exp under the default math: a float32 kernel calls numerics.exp_approx, float64 calls libm.

    exp_approx is within one ulp of the correctly rounded exp (9.5% of a dense grid of 20 million
    points over [-87, 88] one ulp off, none more), where numpy's own float32 ``np.exp``,
    the interpreter's, is off on 39% of the same grid, by up to 3 ulp. Until 2026-11-28 the default
    was numerics.exp_f32 (float64 inside, correctly rounded but for near-ties): 0.47 ns a SiLU
    element against 0.20 on one Zen 5 core, and EfficientNet-B0's SiLUs were a third of its time.
    onnxruntime's MLAS and PyTorch (Sleef's u10 functions) compute exp to the same one-ulp class.
    erf is float32 too (:func:`_erf`); tanh keeps its float64 form: its float32 approximation has
    an absolute error bound, many ulps near 0 (:data:`APPROX_RULES`, ApproxTranscendentalFusionPass)."""
    return f"exp_approx({x})" if dtype == "float32" else f"np.exp({x})"


def _tanh(x: str, dtype: str) -> str:
    """tanh under the default math: numerics.tanh_f32 (float64 inside, rounded once) in a float32
    kernel; float64 calls libm."""
    return f"tanh_f32({x})" if dtype == "float32" else f"np.tanh({x})"


def _erf(x: str, dtype: str) -> str:
    """erf under the default math: numerics.erf_1ulp in a float32 kernel (float32 arithmetic,
    within one ulp of the correctly rounded erf, as :func:`_exp`'s exp: an erf GELU 0.44 ns an
    element against 1.19 for the float64 erf_f32 it replaced on 2026-11-28, which took a third of
    ConvNeXt's time); float64 calls libm."""
    return f"erf_1ulp({x})" if dtype == "float32" else f"math.erf({x})"


SCALAR_RULES: dict[str, ScalarRule] = {
    "Add": lambda a, at, lit, dt: f"({a[0]} + {a[1]})",
    "BiasAdd": lambda a, at, lit, dt: f"({a[0]} + {a[1]})",
    "Sub": lambda a, at, lit, dt: f"({a[0]} - {a[1]})",
    "Mul": lambda a, at, lit, dt: f"({a[0]} * {a[1]})",
    "Div": lambda a, at, lit, dt: f"({a[0]} / {a[1]})",
    "Pow": _pow,
    # np.maximum / np.minimum, not max / min: NaN propagates as numpy's reference does.
    "Maximum": lambda a, at, lit, dt: f"np.maximum({a[0]}, {a[1]})",
    "Minimum": lambda a, at, lit, dt: f"np.minimum({a[0]}, {a[1]})",
    "Greater": lambda a, at, lit, dt: f"({a[0]} > {a[1]})",
    "Less": lambda a, at, lit, dt: f"({a[0]} < {a[1]})",
    "Equal": lambda a, at, lit, dt: f"({a[0]} == {a[1]})",
    "Neg": lambda a, at, lit, dt: f"(-{a[0]})",
    "Relu": lambda a, at, lit, dt: f"np.maximum({a[0]}, {lit(0.0)})",
    "Reciprocal": lambda a, at, lit, dt: f"({lit(1.0)} / {a[0]})",
    "Sqrt": lambda a, at, lit, dt: f"np.sqrt({a[0]})",
    "Rsqrt": lambda a, at, lit, dt: f"({lit(1.0)} / np.sqrt({a[0]}))",
    "Exp": lambda a, at, lit, dt: _exp(a[0], dt),
    "Log": lambda a, at, lit, dt: f"np.log({a[0]})",
    "Tanh": lambda a, at, lit, dt: _tanh(a[0], dt),
    "Erf": lambda a, at, lit, dt: _erf(a[0], dt),
    "Sigmoid": lambda a, at, lit, dt: f"({lit(1.0)} / ({lit(1.0)} + {_exp(f'-{a[0]}', dt)}))",
    "Silu": lambda a, at, lit, dt: f"({a[0]} / ({lit(1.0)} + {_exp(f'-{a[0]}', dt)}))",
    "SwiGlu": lambda a, at, lit, dt: f"({a[0]} / ({lit(1.0)} + {_exp(f'-{a[0]}', dt)}) * {a[1]})",
    "Gelu": _gelu,
    "GeGlu": lambda a, at, lit, dt: f"({_gelu(a, at, lit, dt)} * {a[1]})",
    "Clip": lambda a, at, lit, dt: f"np.minimum(np.maximum({a[0]}, {lit(at.get('min', -np.inf))}), {lit(at.get('max', np.inf))})",
    "LeakyRelu": lambda a, at, lit, dt: f"({a[0]} if {a[0]} >= {lit(0.0)} else {a[0]} * {lit(at.get('alpha', 0.01))})",
    "HardSigmoid": lambda a, at, lit, dt: (
        f"np.minimum(np.maximum({a[0]} * {lit(at.get('alpha', 0.2))} + {lit(at.get('beta', 0.5))}, {lit(0.0)}), {lit(1.0)})"
    ),
    "HardSwish": lambda a, at, lit, dt: (
        f"({a[0]} * np.minimum(np.maximum({a[0]} * {lit(1.0 / 6.0)} + {lit(0.5)}, {lit(0.0)}), {lit(1.0)}))"
    ),
    # Inference BatchNorm over broadcast (C, 1, ...) parameters; ConvBatchnormFusionPass folds it
    # into the conv's weights instead when it follows a Conv.
    "BatchNorm": lambda a, at, lit, dt: (
        f"(({a[0]} - {a[3]}) / np.sqrt({a[4]} + {lit(at.get('eps', 1e-5))}) * {a[1]} + {a[2]})"
    ),
    "Cast": _cast,
    "Where": lambda a, at, lit, dt: f"({a[1]} if {a[0]} else {a[2]})",
    # Expand is a pure index map: inside a loop nest the broadcast read already does it.
    "Expand": lambda a, at, lit, dt: a[0],
}


# ---- the elementwise backward ops (ir/_ops_grad.py) ------------------------------------------------
def _gelu_cdf(x: str, attrs: Mapping[str, Any], lit: Lit, dtype: str, approx: bool = False) -> str:
    """GELU's gate ``(1 + erf(x / sqrt 2)) / 2`` (tanh form: ``(1 + tanh(u)) / 2``)."""
    if attrs.get("approximate", "none") == "tanh":
        inner = f"{lit(0.7978845608028654)} * ({x} + {lit(0.044715)} * {x} * {x} * {x})"
        th = _f32_call("tanh_approx", inner, dtype) if approx else _tanh(inner, dtype)
        return f"({lit(0.5)} * ({lit(1.0)} + {th}))"
    arg = f"{x} * {lit(0.7071067811865476)}"
    erf = _f32_call("erf_approx", arg, dtype) if approx else _erf(arg, dtype)
    return f"({lit(0.5)} * ({lit(1.0)} + {erf}))"


def _gelu_grad(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str, approx: bool = False) -> str:
    """``dy * gelu'(x)``; a third operand is the forward's saved gate, so no erf (tanh) is called."""
    x, dy = a[0], a[1]
    c = a[2] if len(a) == 3 else _gelu_cdf(x, attrs, lit, dtype, approx)
    if attrs.get("approximate", "none") == "tanh":
        du = f"{lit(0.7978845608028654)} * ({lit(1.0)} + {lit(3 * 0.044715)} * {x} * {x})"
        return f"({dy} * ({c} + {lit(2.0)} * {x} * {c} * ({lit(1.0)} - {c}) * {du}))"
    arg = f"{lit(-0.5)} * {x} * {x}"
    e = _f32_call("exp_approx", arg, dtype) if approx else _exp(arg, dtype)
    return f"({dy} * ({c} + {x} * {e} * {lit(0.3989422804014327)}))"


SCALAR_RULES.update({
    "GeluCdf": lambda a, at, lit, dt: _gelu_cdf(a[0], at, lit, dt),
    "GeluGrad": _gelu_grad,
    "ReluGrad": lambda a, at, lit, dt: f"({a[1]} if {a[0]} > {lit(0.0)} else {lit(0.0)})",
})


# ---- the logic, comparison and elementwise ops of real exports (ir/_ops_logic.py) ----------------
def _truth(x: str) -> str:
    """``x`` as a bool: a number is true when nonzero (NaN too), as numpy's logical ops say."""
    return f"({x} != 0)"


def _sign(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    # Selects, not np.sign: numba's sign keeps -0.0 where numpy gives +0.0; NaN stays NaN.
    x = a[0]
    zero = f"({lit(0.0)} if {x} == {x} else {x})"
    return f"({lit(1.0)} if {x} > {lit(0.0)} else ({lit(-1.0)} if {x} < {lit(0.0)} else {zero}))"


def _mod(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    x, y = a
    if not int(attrs.get("fmod", 0)):
        return f"({x} % {y})"  # numba's % is Python's floor remainder: np.mod, signed zeros too
    if dtype.startswith("float"):
        return f"np.fmod({x}, {y})"
    # numba's np.fmod of integers takes the divisor's sign; C's remainder has the dividend's.
    r = f"(abs({x}) % abs({y}))"
    return f"({r} if {x} >= 0 else -{r})"


def _is_inf(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    pos, neg = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    if pos and neg:
        return f"np.isinf({a[0]})"
    if pos or neg:
        return f"({a[0]} == {lit(np.inf if pos else -np.inf)})"
    return "False"


SCALAR_RULES.update({
    "And": lambda a, at, lit, dt: f"({_truth(a[0])} & {_truth(a[1])})",
    "Or": lambda a, at, lit, dt: f"({_truth(a[0])} | {_truth(a[1])})",
    "Xor": lambda a, at, lit, dt: f"({_truth(a[0])} != {_truth(a[1])})",
    "Not": lambda a, at, lit, dt: f"({a[0]} == 0)",
    "GreaterOrEqual": lambda a, at, lit, dt: f"({a[0]} >= {a[1]})",
    "LessOrEqual": lambda a, at, lit, dt: f"({a[0]} <= {a[1]})",
    "IsNaN": lambda a, at, lit, dt: f"np.isnan({a[0]})",
    "IsInf": _is_inf,
    "Abs": lambda a, at, lit, dt: f"np.abs({a[0]})",
    "Sign": _sign,
    "Cos": lambda a, at, lit, dt: f"np.cos({a[0]})",
    "Sin": lambda a, at, lit, dt: f"np.sin({a[0]})",
    "Mod": _mod,
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x (np.logaddexp(0, x)).
    "Softplus": lambda a, at, lit, dt: (
        f"(np.maximum({a[0]}, {lit(0.0)}) + np.log1p(np.exp(-np.abs({a[0]}))))"
    ),
    "Elu": lambda a, at, lit, dt: (
        f"({a[0]} if {a[0]} >= {lit(0.0)} else {lit(at.get('alpha', 1.0))} * np.expm1({a[0]}))"
    ),
    "Selu": lambda a, at, lit, dt: (
        f"({lit(at['gamma'])} * {a[0]} if {a[0]} > {lit(0.0)}"
        f" else {lit(at['gamma'] * at['alpha'])} * np.expm1({a[0]}))"
    ),
    "PRelu": lambda a, at, lit, dt: f"({a[0]} * {a[1]} if {a[0]} < {lit(0.0)} else {a[0]})",
})

# math="approx": the ops whose libm calls become calls of codegen/numerics.py. Each keeps the
# structure of its libm rule (Silu stays x / (1 + exp(-x)), whose limits are right at +-inf).
APPROX_RULES: dict[str, ScalarRule] = {
    "Exp": lambda a, at, lit, dt: _f32_call("exp_approx", a[0], dt),
    "Tanh": lambda a, at, lit, dt: _f32_call("tanh_approx", a[0], dt),
    "Erf": lambda a, at, lit, dt: _f32_call("erf_approx", a[0], dt),
    "Sigmoid": lambda a, at, lit, dt: _f32_call("sigmoid_approx", a[0], dt),
    "Silu": lambda a, at, lit, dt: f"({a[0]} / ({lit(1.0)} + {_f32_call('exp_approx', f'-{a[0]}', dt)}))",
    "SwiGlu": lambda a, at, lit, dt: f"({a[0]} / ({lit(1.0)} + {_f32_call('exp_approx', f'-{a[0]}', dt)}) * {a[1]})",
    "Gelu": lambda a, at, lit, dt: _gelu(a, at, lit, dt, approx=True),
    "GeGlu": lambda a, at, lit, dt: f"({_gelu(a, at, lit, dt, approx=True)} * {a[1]})",
    "GeluCdf": lambda a, at, lit, dt: _gelu_cdf(a[0], at, lit, dt, approx=True),
    "GeluGrad": lambda a, at, lit, dt: _gelu_grad(a, at, lit, dt, approx=True),
}

# The functions of codegen/numerics.py that generated code may call; a kernel that calls any of
# them imports them (codegen/common.py: kernel_header).
NUMERICS_FUNCTIONS = (
    "exp_approx", "tanh_approx", "sigmoid_approx", "erf_approx", "round_float16", "round_bfloat16", "fmaximum",
    "arith_fence", "exp_f32", "tanh_f32", "erf_f32", "erf_1ulp", "opaque",
)

MATH_MODES = ("libm", "approx")
"""Values of a group's ``schedule["math"]`` (absent means ``libm``)."""
PRECISIONS = ("float32", "float16", "bfloat16")
"""Values of ``schedule["precision"]`` (absent or ``float32`` means the graph's own dtypes)."""
LOW_PRECISIONS = ("float16", "bfloat16")

# Ops whose result is one of their (already rounded) operands, or its negation: exact in any
# precision, so low-precision mode does not round them again.
EXACT_OPS = frozenset({"Maximum", "Minimum", "Relu", "Neg", "Where", "Expand"})


def scalar_expr(op: str, operands: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str, approx: bool = False) -> str:
    """The expression computing ``op`` over operand locals; ``approx`` picks ``APPROX_RULES`` first."""
    rule = APPROX_RULES.get(op) if approx else None
    return (rule or SCALAR_RULES[op])(operands, attrs, lit, dtype)


def round_expr(expr: str, precision: str | None, dtype: str) -> str:
    """``expr`` rounded to ``precision`` (float16 / bfloat16) if it is a float32 or float64 value.

    A float64 value is rounded through float32. The double rounding differs from rounding the
    float64 directly (by one low-precision ulp) only for values within half a float32 ulp of a
    low-precision tie.
    """
    if precision not in LOW_PRECISIONS or dtype not in ("float32", "float64"):
        return expr
    fn = "round_float16" if precision == "float16" else "round_bfloat16"
    return _f32_call(fn, expr, dtype)


def round_literal(value: float, precision: str | None, dtype: str) -> float:
    """A scalar constant as a low-precision kernel holds it (through float32, as :func:`round_expr`)."""
    if precision not in LOW_PRECISIONS or dtype not in ("float32", "float64") or np.isnan(value):
        return value
    with np.errstate(over="ignore"):
        v32 = np.float32(value)
        if precision == "float16":
            return float(np.float16(v32))
    bits = int(v32.view(np.uint32))  # bfloat16: round the upper half of the bits to nearest even
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.uint32(bits).view(np.float32))


# Reductions: (initial value, update statements, finish expression). ``{flag}`` is a boolean
# accumulator initialized False (no rule uses one now). The max accumulates with numerics.py's
# ``fmaximum`` (llvm.maximum), which propagates NaN as np.max does and vectorizes: a select
# ``v if v > acc else acc`` plus a "seen a NaN" flag stayed scalar under this LLVM (5x slower on
# a row max), np.maximum too.
REDUCE_RULES: dict[str, tuple[float, tuple[str, ...], str]] = {
    "ReduceSum": (0.0, ("{acc} += {v}",), "{acc}"),
    "ReduceMean": (0.0, ("{acc} += {v}",), "{acc} * {inv_n}"),
    "ReduceMax": (-np.inf, ("{acc} = fmaximum({acc}, {v})",), "{acc}"),
}

# The index and layout ops of real exports (ir/_ops_index.py): kernels of their own (codegen/index.py).
INDEX_OPS = ("GatherND", "GatherElements", "ScatterND", "CumSum", "Trilu", "Tile", "Pad")
LAYOUT_OPS = ("Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", *INDEX_OPS)
CONTRACTION_OPS = ("MatMul", "Conv", "ConvTranspose")  # ConvTranspose: codegen/conv_transpose.py
WINDOW_OPS = ("MaxPool", "AveragePool")  # one kernel per node (codegen/pool.py)
ATTENTION_OPS = ("Attention", "AttentionGrad")  # one kernel per node (codegen/attention.py, attention_grad.py)
OPAQUE_OPS = ("RotaryPositionEmbedding",)  # one kernel per node (codegen/rotary.py)


def rule_kind(op: str) -> str | None:
    """Which codegen rule covers ``op``: scalar, reduce, expand, contraction, window, layout,
    attention, opaque, or None."""
    if op in SCALAR_RULES:
        return "scalar"
    if op in REDUCE_RULES:
        return "reduce"
    if op in EXPANDABLE:
        return "expand"
    if op in CONTRACTION_OPS:
        return "contraction"
    if op in WINDOW_OPS:
        return "window"
    if op in LAYOUT_OPS:
        return "layout"
    if op in ATTENTION_OPS:
        return "attention"
    if op in OPAQUE_OPS:
        return "opaque"
    return None
