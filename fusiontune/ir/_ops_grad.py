"""Catalogue ops for the backward of the fused ops (MindSpore's ``SoftmaxGrad``, ``LayerNormGrad``...).

The vector-Jacobian rules of Softmax, LayerNorm, RMSNorm (and their Add+ forms), Gelu, Relu and
Attention write these ops (ir/_vjp_reduce.py, ir/_vjp_elementwise.py, ir/_vjp_nn.py); the backward
passes (passes/graph/grad_fusion.py) keep each one as one kernel or expand it into the primitive
form (ir/expand.py), which is what the rules wrote before these ops existed. With ``g`` the
cotangent (``dy``), ``n`` the row length and the statistics over the last axis:

* ``SoftmaxGrad(y, dy)``: ``dx = y * (dy - sum(dy * y))`` over ``axis``; ``y`` is the softmax
  output, which the forward saves anyway.
* ``LayerNormGrad(x, gamma, dy[, mean, rstd]) -> (dx, dy * x̂)``: ``x̂ = (x - mean) * rstd``,
  ``ĝ = dy * gamma``, ``dx = rstd * (ĝ - mean(ĝ) - x̂ * mean(ĝ * x̂))``. The second output summed
  over the batch axes is gamma's gradient (that ReduceSum stays an ordinary node). Without
  ``mean, rstd`` the op recomputes them from ``x`` as the forward did (``eps``, ``variance``);
  with them (a forward LayerNorm with ``save_stats=1`` wrote them) it reads them.
* ``RmsNormGrad(x, gamma, dy[, rstd]) -> (dx, dy * x * rstd)``:
  ``dx = rstd * ĝ - x * rstd^3 * mean(ĝ * x)``.
* ``GeluGrad(x, dy[, cdf])``: ``dx = dy * gelu'(x)``. Erf form: ``gelu'(x) = Phi(x) + x phi(x)``,
  ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, ``phi(x) = exp(-x^2 / 2) / sqrt(2 pi)``. With ``cdf``
  (= ``GeluCdf(x)``, saved by the forward) no erf is evaluated, only the exp. Tanh form
  (``approximate="tanh"``): ``c = (1 + tanh(u)) / 2``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``,
  ``gelu'(x) = c + 2 x c (1 - c) u'`` (``1 - tanh^2 = 4 c (1 - c)``): with the saved ``c`` no
  transcendental at all.
* ``GeluCdf(x)``: the gate ``Phi(x)`` (or the tanh form's ``c``), so that ``Gelu(x) = x * GeluCdf(x)``;
  a forward that keeps it for the backward computes Gelu this way.
* ``ReluGrad(y, dy)``: ``dy`` where ``y > 0``, else 0 (Relu's subgradient 0 at 0, as its rule);
  it reads the forward *output*, so the input of a ``Relu(a + b)`` (seed 004's FusedAddReLU) need
  not be kept for the backward.
* ``AttentionGrad(q, k, v, dy[, mask]) -> (dq, dk, dv)``: the flash-attention backward of
  ``Attention`` (same ``scale``): the probabilities ``p = softmax(q k^T * scale + mask)`` are
  recomputed from q and k, ``dv = p^T dy``, ``ds = p * (dp - sum(dp * p))`` with ``dp = dy v^T``,
  ``dq = scale * ds k``, ``dk = scale * ds^T q``. q, k, v and dy share their batch axes (no
  broadcast); the mask broadcasts to the scores and gets no gradient (a rule that needs one writes
  the primitive form).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from fusiontune.ir.graph import Shape, Value
from fusiontune.ir.ops import (
    OpDef,
    _broadcast,
    _register,
    broadcast_shapes,
    layer_norm_stats,
    normalize_axis,
    result_dtype,
    rms_norm_rstd,
)

SQRT_2PI = float(np.sqrt(2.0 * np.pi))
TANH_GELU_C = float(np.sqrt(2.0 / np.pi))
TANH_GELU_K = 0.044715


def _same_as(a: Value, b: Value, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{what}: {b.name} {b.shape} must have the shape of {a.name} {a.shape}")


def _softmax_grad_shape(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    y, dy = ins
    _same_as(y, dy, "SoftmaxGrad")
    normalize_axis(attrs.get("axis", -1), len(y.shape))
    return [(y.shape, result_dtype(ins))]


def _norm_grad_shape(stats: int) -> Any:
    """Shape rule of LayerNormGrad (``stats=2``: mean, rstd) or RmsNormGrad (``stats=1``: rstd)."""

    def infer(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
        x, gamma, dy, *saved = ins
        name = "LayerNormGrad" if stats == 2 else "RmsNormGrad"
        if not x.shape:
            raise ValueError(f"{name} needs x of rank >= 1")
        _same_as(x, dy, name)
        n = x.shape[-1]
        if gamma.shape not in ((n,), (1, n)) and broadcast_shapes(gamma.shape, x.shape) != x.shape:
            raise ValueError(f"{name}: gamma {gamma.shape} does not fit x {x.shape}")
        if len(saved) not in (0, stats):
            raise ValueError(f"{name} takes {stats} saved statistics or none, got {len(saved)}")
        row = (*x.shape[:-1], 1)
        for s in saved:
            if s.shape != row:
                raise ValueError(f"{name}: saved statistic {s.name} {s.shape} must be {row}")
        dtype = result_dtype([x, dy])
        return [(x.shape, dtype), (x.shape, dtype)]

    return infer


def _softmax_grad(attrs: Mapping[str, Any], y: np.ndarray, dy: np.ndarray) -> tuple:
    axis = attrs.get("axis", -1)
    return ((y * (dy - np.sum(dy * y, axis=axis, keepdims=True))).astype(y.dtype, copy=False),)


def _layer_norm_grad(attrs: Mapping[str, Any], x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, *saved: np.ndarray) -> tuple:
    if saved:
        mean, rstd = saved
    else:
        mean, rstd = layer_norm_stats(x, attrs.get("eps", 1e-5), attrs.get("variance", "two_pass"))
    xhat = (x - mean) * rstd
    gh = dy * gamma
    inner = gh - gh.mean(axis=-1, keepdims=True) - xhat * (gh * xhat).mean(axis=-1, keepdims=True)
    return ((rstd * inner).astype(x.dtype, copy=False), (dy * xhat).astype(x.dtype, copy=False))


def _rms_norm_grad(attrs: Mapping[str, Any], x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, *saved: np.ndarray) -> tuple:
    r = saved[0] if saved else rms_norm_rstd(x, attrs.get("eps", 1e-6))
    gh = dy * gamma
    dx = r * gh - x * (r * r * r) * (gh * x).mean(axis=-1, keepdims=True)
    return (dx.astype(x.dtype, copy=False), (dy * (x * r)).astype(x.dtype, copy=False))


def gelu_cdf(x: np.ndarray, approximate: str) -> np.ndarray:
    """GELU's gate: ``Phi(x)``, or ``(1 + tanh(u)) / 2`` for the tanh form; in x's dtype."""
    t = x.dtype.type
    if approximate == "tanh":
        u = t(TANH_GELU_C) * (x + t(TANH_GELU_K) * x * x * x)
        return t(0.5) * (t(1.0) + np.tanh(u))
    return t(0.5) * (t(1.0) + special.erf(x * t(1.0 / np.sqrt(2.0))))


def _gelu_grad(attrs: Mapping[str, Any], x: np.ndarray, dy: np.ndarray, *cdf: np.ndarray) -> tuple:
    t = x.dtype.type
    c = cdf[0] if cdf else gelu_cdf(x, attrs.get("approximate", "none"))
    if attrs.get("approximate", "none") == "tanh":
        du = t(TANH_GELU_C) * (t(1.0) + t(3.0 * TANH_GELU_K) * x * x)
        slope = c + t(2.0) * x * c * (t(1.0) - c) * du
    else:
        slope = c + x * np.exp(t(-0.5) * x * x) * t(1.0 / SQRT_2PI)
    return ((dy * slope).astype(result_type(x, dy), copy=False),)


def result_type(*xs: np.ndarray) -> np.dtype:
    return np.result_type(*(x.dtype for x in xs))


_register(
    OpDef(
        "SoftmaxGrad", "reduction", _softmax_grad_shape, _softmax_grad, 2, attrs={"axis": -1},
        doc="Softmax's backward from its output y: y * (dy - sum(dy * y)) over axis",
    )
)
_register(
    OpDef(
        "LayerNormGrad", "reduction", _norm_grad_shape(2), _layer_norm_grad, (3, 5),
        attrs={"eps": 1e-5, "variance": "two_pass"},
        doc="LayerNorm's backward over the last axis -> (dx, dy * x̂); reads the forward's saved "
        "(mean, rstd) when given, else recomputes them (eps, variance as the forward)",
    )
)
_register(
    OpDef(
        "RmsNormGrad", "reduction", _norm_grad_shape(1), _rms_norm_grad, (3, 4),
        attrs={"eps": 1e-6},
        doc="RMSNorm's backward over the last axis -> (dx, dy * x * rstd); reads the saved rstd when given",
    )
)
_register(
    OpDef(
        "GeluGrad", "elementwise", _broadcast, _gelu_grad, (2, 3), attrs={"approximate": "none"},
        doc="dy * gelu'(x); with the forward's saved GeluCdf(x) as third input, no erf (no tanh)",
    )
)
_register(
    OpDef(
        "GeluCdf", "elementwise",
        lambda attrs, ins: [(ins[0].shape, ins[0].dtype)],
        lambda attrs, x: (gelu_cdf(x, attrs.get("approximate", "none")).astype(x.dtype, copy=False),),
        1, attrs={"approximate": "none"},
        doc="GELU's gate Phi(x) = (1 + erf(x / sqrt 2)) / 2 (tanh form: (1 + tanh(u)) / 2): Gelu(x) = x * GeluCdf(x)",
    )
)
_register(
    OpDef(
        "ReluGrad", "elementwise", _broadcast,
        lambda attrs, y, dy: (np.where(y > 0, dy, dy.dtype.type(0)).astype(result_type(y, dy), copy=False),),
        2, basic=True,
        doc="Relu's backward from its output y: dy where y > 0, else 0",
    )
)


def _attention_grad_shape(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    q, k, v, dy = ins[:4]
    if len(q.shape) < 2 or not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2] == dy.shape[:-2]):
        raise ValueError(f"AttentionGrad needs q, k, v, dy with one batch shape, got {q.shape}, {k.shape}, {v.shape}, {dy.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or dy.shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"AttentionGrad shapes: q {q.shape}, k {k.shape}, v {v.shape}, dy {dy.shape}")
    if len(ins) == 5:
        scores = (*q.shape[:-1], k.shape[-2])
        if broadcast_shapes(scores, ins[4].shape) != scores:
            raise ValueError(f"AttentionGrad mask {ins[4].shape} does not broadcast to the scores {scores}")
    dtype = result_dtype(ins[:4])
    return [(q.shape, dtype), (k.shape, dtype), (v.shape, dtype)]


def _attention_grad(attrs: Mapping[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, dy: np.ndarray, *mask: np.ndarray) -> tuple:
    scale = q.dtype.type(attrs.get("scale", 1.0))
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask:
        s = s + mask[0]
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    dp = np.matmul(dy, np.swapaxes(v, -1, -2))
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dtype = result_type(q, k, v, dy)
    return (
        (np.matmul(ds, k) * scale).astype(dtype, copy=False),
        (np.matmul(np.swapaxes(ds, -1, -2), q) * scale).astype(dtype, copy=False),
        np.matmul(np.swapaxes(p, -1, -2), dy).astype(dtype, copy=False),
    )


_register(
    OpDef(
        "AttentionGrad", "attention", _attention_grad_shape, _attention_grad, (4, 5), attrs={"scale": 1.0},
        doc="Attention's backward -> (dq, dk, dv): p recomputed from q, k (and the mask), "
        "ds = p * (dy v^T - rowsum), dq = scale ds k, dk = scale ds^T q, dv = p^T dy",
    )
)
