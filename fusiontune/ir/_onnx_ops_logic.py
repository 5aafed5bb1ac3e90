"""ONNX converters for the logic, comparison and elementwise ops (see ``_ops_logic``).

Opsets 6 to 22 of the default domain. What changes between the opsets these ops exist in:

* ``And``, ``Or``, ``Xor`` (1, 7) and ``Equal`` (1, 7, 11, 13, 19), ``Greater`` / ``Less`` (1, 7, 9,
  13): before opset 7 a ``broadcast=1, axis=k`` attribute pair aligns B with A's axes from ``k``
  (``_onnx_ops._legacy_broadcast``); from 7 on, numpy broadcasting. Later versions only add types.
* ``GreaterOrEqual`` / ``LessOrEqual`` (12, 16), ``IsNaN`` (9, 13, 20), ``IsInf`` (10, 20),
  ``Not`` (1), ``Cos`` / ``Sin`` (7, 22), ``Abs`` (6, 13), ``Sign`` (9, 13), ``Mod`` (10, 13),
  ``Softplus`` (1, 22), ``Elu`` / ``Selu`` (6, 22), ``PRelu`` (6, 7, 9, 16): the same semantics
  in every version, with more types. PRelu-6 allows a slope of X's shape or of one element, both
  of which the later unidirectional broadcasting covers. ``Where`` (9, 16) keeps the converter of
  ``_onnx_ops`` (its shape rule broadcasts all three operands).
* ``LogSoftmax`` (1, 11, 13): before opset 13 the input is coerced to 2-D at ``axis`` (default 1)
  and the softmax runs over the flattened trailing axes; from 13 on it runs over the one ``axis``
  (default -1), which a non-last axis gets by a transpose around it (as the Softmax converter).
* ``CastLike`` (15, 19, 21): a Cast to the dtype of the second input.
* ``InstanceNormalization`` (6, 22): written as a LayerNorm of the (N*C, H*W...) view followed
  by the per-channel affine (see :func:`_instance_norm`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusiontune.ir._onnx_ops import CONVERTERS, _binary, _conv, _simple
from fusiontune.ir.onnx_import import Importer
from fusiontune.ir.ops import normalize_axis

for _name in ("Not", "IsNaN", "Abs", "Sign", "Cos", "Sin", "Softplus"):
    CONVERTERS[_name] = _simple(_name)
for _name in ("And", "Or", "Xor", "GreaterOrEqual", "LessOrEqual"):
    CONVERTERS[_name] = _binary(_name)


@_conv("IsInf")
def _is_inf(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    a = {
        "detect_positive": int(attrs.get("detect_positive", 1)),
        "detect_negative": int(attrs.get("detect_negative", 1)),
    }
    return imp.emit("IsInf", ins[:1], a, node.output[:1])


@_conv("Mod")
def _mod(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """``fmod=0``: the divisor's sign (integers; ONNX asks for ``fmod=1`` on floats, and a float
    ``fmod=0`` is computed as ``np.mod``, as the onnx reference does); ``fmod=1``: C's fmod."""
    return imp.emit("Mod", ins[:2], {"fmod": int(attrs.get("fmod", 0))}, node.output[:1])


@_conv("Elu")
def _elu(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return imp.emit("Elu", ins[:1], {"alpha": float(attrs.get("alpha", 1.0))}, node.output[:1])


@_conv("Selu")
def _selu(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    from fusiontune.ir._ops_logic import SELU_ALPHA, SELU_GAMMA

    a = {
        "alpha": float(attrs.get("alpha", SELU_ALPHA)),
        "gamma": float(attrs.get("gamma", SELU_GAMMA)),
    }
    return imp.emit("Selu", ins[:1], a, node.output[:1])


@_conv("PRelu")
def _prelu(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """The slope broadcasts to X (ONNX's unidirectional broadcasting: (C, 1, 1) against
    (N, C, H, W) is per channel)."""
    x, slope = ins
    if imp.dtype(slope) != imp.dtype(x):
        slope = imp.cast_like(slope, imp.dtype(x))
    return imp.emit("PRelu", [x, slope], {}, node.output[:1])


@_conv("CastLike")
def _cast_like(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """``CastLike(x, like)``: a Cast to ``like``'s dtype (no catalogue op of its own; ``like`` is
    read for its dtype only). The ``saturate`` attribute (opset 19) concerns float8 targets only,
    which have no dtype here."""
    to = imp.dtype(ins[1])
    if imp.dtype(ins[0]) == to:
        return [ins[0]]
    return imp.emit("Cast", ins[:1], {"to": to}, node.output[:1])


@_conv("LogSoftmax")
def _log_softmax(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x = ins[0]
    shape = imp.shape(x)
    rank = len(shape)
    axis = normalize_axis(int(attrs.get("axis", -1 if imp.opset >= 13 else 1)), rank)
    if axis == rank - 1:
        return imp.emit("LogSoftmax", [x], {"axis": -1}, node.output[:1])
    if imp.opset < 13:  # log-softmax over the flattened trailing axes [axis, rank)
        flat = imp.reshape(x, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))
        s = imp.emit("LogSoftmax", [flat], {"axis": -1}, tag="logsoftmax")[0]
        return [imp.reshape(s, shape, node.output[:1], tag=None)]
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]  # a swap: its own inverse
    t = imp.emit("Transpose", [x], {"perm": tuple(perm)}, tag="to_last")[0]
    s = imp.emit("LogSoftmax", [t], {"axis": -1}, tag="logsoftmax")[0]
    return imp.emit("Transpose", [s], {"perm": tuple(perm)}, node.output[:1])


@_conv("InstanceNormalization")
def _instance_norm(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """Instance normalization as a LayerNorm over a reshape, then the per-channel affine.

    Identity, for x of shape (N, C, S...) with scale and B of shape (C,), and L = prod(S):
    ``InstanceNorm(x, scale, B, eps)[n, c] == (x[n, c] - mean) / sqrt(var + eps) * scale[c] + B[c]``
    with mean and (biased) var over the spatial axes of ``x[n, c]``; that is row ``n * C + c`` of
    ``LayerNorm(reshape(x, (N*C, L)), ones(L), zeros(L), eps)`` (a LayerNorm over the last axis),
    reshaped back to (N, C, S...), times ``reshape(scale, (C, 1...))`` plus
    ``reshape(B, (C, 1...))``.
    Exact: the LayerNorm's gamma of ones and beta of zeros change no bit.
    """
    x, scale, bias = ins[:3]
    shape = imp.shape(x)
    if len(shape) < 3:
        raise imp.fail(f"InstanceNormalization needs an input (N, C, spatial...), got {shape}")
    n, c, spatial = shape[0], shape[1], int(np.prod(shape[2:]))
    dtype = imp.dtype(x)
    eps = float(attrs.get("epsilon", 1e-5))
    rows = imp.reshape(x, (n * c, spatial), tag="rows")
    ones = imp.const(np.ones((spatial,), dtype), "ones")
    zeros = imp.const(np.zeros((spatial,), dtype), "zeros")
    y = imp.emit("LayerNorm", [rows, ones, zeros], {"eps": eps}, tag="layernorm")[0]
    y = imp.reshape(y, shape, tag="unrows")
    per_channel = (c,) + (1,) * (len(shape) - 2)
    s = imp.reshape(imp.cast_like(scale, dtype), per_channel, tag="scale")
    b = imp.reshape(imp.cast_like(bias, dtype), per_channel, tag="bias")
    y = imp.emit("Mul", [y, s], {}, tag="scale_mul")[0]
    return imp.emit("Add", [y, b], {}, node.output[:1])
