"""Catalogue ops for the logic, comparison and elementwise ops real exporters emit on live data.

Each op is registered into :data:`fusiontune.ir.ops.CATALOGUE` with its kind, shape rule and
numpy reference, exactly like the ops of ``ops.py``. The references follow the ONNX operator
specification (the text, and where it is silent the onnx package's reference implementation):

* logic (``And``, ``Or``, ``Xor``, ``Not``): ONNX types them over bool only; the references are
  numpy's logical functions, so a number reads as true when it is nonzero (NaN is true), which is
  the same on bools and gives every other dtype one meaning too.
* comparisons (``GreaterOrEqual``, ``LessOrEqual``, ``IsNaN``, ``IsInf``) give bool; a NaN
  compares false, as IEEE 754 and numpy say.
* ``Mod``: ``fmod=0`` is the floor remainder, with the sign of the divisor (Python's ``%``,
  ``np.mod``), ``fmod=1`` the truncated remainder with the sign of the dividend (C's ``fmod``,
  ``np.fmod``). ONNX asks for ``fmod=1`` on floats; the catalogue still defines ``fmod=0`` on floats
  as ``np.mod``, the onnx reference implementation's choice. An integer remainder by zero is 0.
* ``Sign`` of NaN is NaN, of -0.0 is +0.0 (``np.sign``).
* ``Softplus`` is ``log(1 + exp(x))`` evaluated without overflow (``np.logaddexp(0, x)``, the onnx
  reference's form): ``log(exp(x) + 1)`` written out is inf for float32 x above 88.
* ``Elu``, ``Selu``, ``PRelu`` take their branches exactly where the spec puts them (``x >= 0``,
  ``x > 0``, ``x < 0``) and use ``expm1`` for ``exp(x) - 1``.
* ``LogSoftmax``: ``x - max - log(sum(exp(x - max)))`` over one axis (a ``reduction``; codegen
  lowers it through its expansion, ir/expand.py, as Softmax).

CastLike needs no op of its own (the converter writes a Cast to the dtype of its second input), nor
does InstanceNormalization (the converter writes a LayerNorm over an (N*C, H*W) view and the
per-channel affine); both are in ir/_onnx_ops_logic.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fusiontune.ir.graph import Shape, Value
from fusiontune.ir.ops import (
    FLOAT_DTYPES,
    OpDef,
    _broadcast,
    _compare,
    _ew,
    _register,
    _same,
    broadcast_shapes,
    normalize_axis,
    result_dtype,
)

SELU_ALPHA = 1.67326319217681884765625
"""ONNX Selu's default ``alpha`` (the float32 value the spec writes)."""
SELU_GAMMA = 1.05070102214813232421875
"""ONNX Selu's default ``gamma``."""


# ---- shape rules ---------------------------------------------------------------------------------
def _predicate(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    """A unary test: x's shape, bool."""
    return [(ins[0].shape, "bool")]


def _float_predicate(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    if ins[0].dtype not in FLOAT_DTYPES:
        raise ValueError(f"input must be a float tensor, got {ins[0].dtype}")
    return _predicate(attrs, ins)


def _mod(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    if int(attrs.get("fmod", 0)) not in (0, 1):
        raise ValueError(f"fmod must be 0 or 1, got {attrs['fmod']!r}")
    return _broadcast(attrs, ins)


def _prelu(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    """ONNX's unidirectional broadcasting: the slope broadcasts to x's shape, never the reverse."""
    x, slope = ins
    if broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ValueError(f"slope {slope.shape} does not broadcast to the input {x.shape}")
    return [(x.shape, result_dtype(ins))]


def _axis_same(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    normalize_axis(int(attrs.get("axis", -1)), len(ins[0].shape))
    return _same(attrs, ins)


# ---- references ----------------------------------------------------------------------------------
def _scalar(x: np.ndarray, value: float) -> Any:
    """``value`` in x's dtype (a float attribute applied to a float32 tensor stays float32)."""
    return x.dtype.type(value)


def _sign(x: np.ndarray) -> np.ndarray:
    return np.sign(x) + x.dtype.type(0)  # + 0: sign(-0.0) is +0.0 on every numpy


def _mod_ref(attrs: Mapping[str, Any], a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    fn = np.fmod if int(attrs.get("fmod", 0)) else np.mod
    return _ew(fn)(attrs, a, b)


def _is_inf(attrs: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, ...]:
    out = np.zeros(x.shape, dtype=bool)
    if int(attrs.get("detect_positive", 1)):
        out |= x == np.inf
    if int(attrs.get("detect_negative", 1)):
        out |= x == -np.inf
    return (out,)


def _elu(attrs: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, ...]:
    alpha = _scalar(x, attrs.get("alpha", 1.0))
    return (np.where(x >= 0, x, alpha * np.expm1(x)).astype(x.dtype),)


def _selu(attrs: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, ...]:
    gamma = _scalar(x, attrs.get("gamma", SELU_GAMMA))
    scale = _scalar(x, attrs.get("gamma", SELU_GAMMA) * attrs.get("alpha", SELU_ALPHA))
    return (np.where(x > 0, gamma * x, scale * np.expm1(x)).astype(x.dtype),)


def _prelu_ref(
    attrs: Mapping[str, Any], x: np.ndarray, slope: np.ndarray
) -> tuple[np.ndarray, ...]:
    dtype = np.result_type(x.dtype, slope.dtype)
    return (np.where(x < 0, x * slope, x).astype(dtype),)


def _log_softmax(attrs: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, ...]:
    axis = attrs.get("axis", -1)
    shifted = x - x.max(axis=axis, keepdims=True)
    return ((shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype),)


def _logical(fn: Callable[..., np.ndarray]) -> Callable[..., tuple[np.ndarray, ...]]:
    def ref(attrs: Mapping[str, Any], *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        return (np.asarray(fn(*xs), dtype=bool),)

    return ref


# ---- the catalogue -------------------------------------------------------------------------------
def _op(
    name: str,
    infer: Callable[[Mapping[str, Any], Sequence[Value]], list[tuple[Shape, str]]],
    ref: Callable[..., tuple[np.ndarray, ...]],
    arity: int,
    doc: str,
    basic: bool = True,
    kind: str = "elementwise",
    **attrs: Any,
) -> None:
    _register(OpDef(name, kind, infer, ref, arity, attrs=attrs, basic=basic, doc=doc))


_op("And", _compare, _logical(np.logical_and), 2, "a and b (bool; a number is true when nonzero)")
_op("Or", _compare, _logical(np.logical_or), 2, "a or b (bool; a number is true when nonzero)")
_op("Xor", _compare, _logical(np.logical_xor), 2, "a xor b (bool; a number is true when nonzero)")
_op("Not", _predicate, _logical(np.logical_not), 1, "not x (bool; a number is true when nonzero)")
_op("GreaterOrEqual", _compare, _ew(np.greater_equal), 2, "a >= b")
_op("LessOrEqual", _compare, _ew(np.less_equal), 2, "a <= b")
_op("IsNaN", _float_predicate, _logical(np.isnan), 1, "x is NaN")
_op(
    "IsInf",
    _float_predicate,
    _is_inf,
    1,
    "x is +inf (detect_positive) or -inf (detect_negative)",
    detect_positive=1,
    detect_negative=1,
)
_op("Abs", _same, _ew(np.abs), 1, "|x|")
_op("Sign", _same, _ew(_sign), 1, "-1, 0 or 1 by the sign of x (NaN stays NaN)")
_op("Cos", _same, _ew(np.cos), 1, "cos x", basic=False)
_op("Sin", _same, _ew(np.sin), 1, "sin x", basic=False)
_op(
    "Mod",
    _mod,
    _mod_ref,
    2,
    "remainder: fmod=0 takes the divisor's sign (np.mod), fmod=1 the dividend's (C fmod)",
    fmod=0,
)
_op(
    "Softplus",
    _same,
    _ew(lambda x: np.logaddexp(x.dtype.type(0), x)),
    1,
    "log(1 + e ** x)",
    basic=False,
)
_op("Elu", _same, _elu, 1, "x if x >= 0 else alpha * (e ** x - 1)", basic=False, alpha=1.0)
_op(
    "Selu",
    _same,
    _selu,
    1,
    "gamma * x if x > 0 else gamma * alpha * (e ** x - 1)",
    basic=False,
    alpha=SELU_ALPHA,
    gamma=SELU_GAMMA,
)
_op("PRelu", _prelu, _prelu_ref, 2, "x if x >= 0 else slope * x; slope broadcasts to x")
_op(
    "LogSoftmax",
    _axis_same,
    _log_softmax,
    1,
    "x - max - log(sum(exp(x - max))) over one axis",
    basic=False,
    kind="reduction",
    axis=-1,
)
