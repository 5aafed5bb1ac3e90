"""Vector-Jacobian rules of the reductions and the row-wise normalizations built on them.

Softmax, LayerNorm and RMSNorm (and the Add+ forms) write their backward as one fused grad op
(``SoftmaxGrad``, ``LayerNormGrad``, ``RmsNormGrad``: ir/_ops_grad.py), whose expansion
(ir/expand.py) is the primitive form below. The grad op recomputes the statistics (mean, rstd)
from the saved input; LayerNormGradFusionPass / RmsNormGradFusionPass make it read the forward's
instead (DESIGN section 13), and when they are off the op is expanded into primitives. With ``g``
the cotangent, ``x̂`` the normalized row and ``n`` its length:

* Softmax: ``dx = y * (g - sum(g * y))``; LogSoftmax: ``dx = g - exp(y) * sum(g)``.
* LayerNorm: ``dx = rstd * (ĝ - mean(ĝ) - x̂ * mean(ĝ * x̂))`` with ``ĝ = g * gamma``
  (the same for both ``variance`` modes wherever the variance is positive).
* RMSNorm: ``dx = r * ĝ - x * r^3 * mean(ĝ * x)`` with ``r = (mean(x^2) + eps)^-1/2``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fusiontune.ir.autodiff import VjpContext, mask, reshape, sum_to, vjp
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.ops import normalize_axes, normalize_axis


def _kept(c: VjpContext) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The reduced axes and the output shape with them kept (as size 1)."""
    shape = c.x().shape
    axes = normalize_axes(c.attrs.get("axes"), len(shape))
    return axes, tuple(1 if i in axes else d for i, d in enumerate(shape))


@vjp("ReduceSum")
def _reduce_sum(c: VjpContext) -> Sequence[Tensor | None]:
    _, kept = _kept(c)
    return [c.b.expand(reshape(c.b, c.g, kept), c.x().shape)]


@vjp("ReduceMean")
def _reduce_mean(c: VjpContext) -> Sequence[Tensor | None]:
    axes, kept = _kept(c)
    count = 1
    for a in axes:
        count *= c.x().shape[a]
    # Divided by the count (an integer, exact in float32 below 2**24), not multiplied by its
    # reciprocal: a float32 constant 1/n would put float32 rounding into the float64 reference.
    return [c.b.expand(c.b.div(reshape(c.b, c.g, kept), float(max(count, 1))), c.x().shape)]


@vjp("ReduceMax")
def _reduce_max(c: VjpContext) -> Sequence[Tensor | None]:
    # The maxima share the gradient evenly (one maximum takes it all).
    b, x = c.b, c.x()
    axes, kept = _kept(c)
    hit = mask(b, b.equal(x, reshape(b, c.y(), kept)), c.g.dtype)
    share = b.div(reshape(b, c.g, kept), b.reduce_sum(hit, axes, keepdims=True))
    return [b.mul(hit, share)]


@vjp("Softmax")
def _softmax(c: VjpContext) -> Sequence[Tensor | None]:
    return [c.b.op("SoftmaxGrad", c.y(), c.g, axis=normalize_axis(c.attrs.get("axis", -1), len(c.y().shape)))]


@vjp("LogSoftmax")
def _log_softmax(c: VjpContext) -> Sequence[Tensor | None]:
    b, y = c.b, c.y()
    axis = normalize_axis(c.attrs.get("axis", -1), len(y.shape))
    return [b.sub(c.g, b.mul(b.exp(y), b.reduce_sum(c.g, axis)))]


def layer_norm_grads(
    b: GraphBuilder, x: Tensor, gamma: Tensor, g: Tensor, eps: float, variance: str = "two_pass"
) -> tuple[Tensor, Tensor]:
    """``(dx, g * x̂)`` of LayerNorm over the last axis, one LayerNormGrad node; ``g * x̂`` summed
    gives gamma's gradient."""
    dx, dgamma = b.op("LayerNormGrad", x, gamma, g, n_outputs=2, eps=eps, variance=variance)
    return dx, dgamma


def rms_norm_grads(
    b: GraphBuilder, x: Tensor, gamma: Tensor, g: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """``(dx, g * x * r)`` of RMSNorm over the last axis, one RmsNormGrad node."""
    dx, dgamma = b.op("RmsNormGrad", x, gamma, g, n_outputs=2, eps=eps)
    return dx, dgamma


@vjp("LayerNorm")
def _layer_norm(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, gamma, beta) = c.b, c.inputs
    dx, dgamma = layer_norm_grads(b, x, gamma, c.g, float(c.attrs["eps"]), c.attrs["variance"])
    return [
        sum_to(b, dx, x.shape) if c.needs[0] else None,
        sum_to(b, dgamma, gamma.shape) if c.needs[1] else None,
        sum_to(b, c.g, beta.shape) if c.needs[2] else None,
    ]


@vjp("RMSNorm")
def _rms_norm(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, gamma) = c.b, c.inputs
    dx, dgamma = rms_norm_grads(b, x, gamma, c.g, float(c.attrs["eps"]))
    return [
        sum_to(b, dx, x.shape) if c.needs[0] else None,
        sum_to(b, dgamma, gamma.shape) if c.needs[1] else None,
    ]


def _add_norm(c: VjpContext, ds: Tensor) -> list[Tensor | None]:
    """The gradients of ``a`` and ``b`` in ``s = a + b``, given the total gradient of ``s``."""
    b = c.b
    if c.cotangents[1] is not None:  # s is also an output
        ds = b.add(ds, c.cotangents[1])
    return [
        sum_to(b, ds, t.shape) if need else None
        for t, need in zip(c.inputs[:2], c.needs[:2], strict=True)
    ]


@vjp("AddLayerNorm")
def _add_layer_norm(c: VjpContext) -> Sequence[Tensor | None]:
    b, (_, _, gamma, beta), s = c.b, c.inputs, c.y(1)
    eps, variance = float(c.attrs["eps"]), c.attrs["variance"]
    dx, dgamma = layer_norm_grads(b, s, gamma, c.cot(0), eps, variance)
    return [
        *_add_norm(c, dx),
        sum_to(b, dgamma, gamma.shape) if c.needs[2] else None,
        sum_to(b, c.cot(0), beta.shape) if c.needs[3] else None,
    ]


@vjp("AddRmsNorm")
def _add_rms_norm(c: VjpContext) -> Sequence[Tensor | None]:
    b, gamma, s = c.b, c.x(2), c.y(1)
    dx, dgamma = rms_norm_grads(b, s, gamma, c.cot(0), float(c.attrs["eps"]))
    return [*_add_norm(c, dx), sum_to(b, dgamma, gamma.shape) if c.needs[2] else None]
