"""Vector-Jacobian rules of the elementwise ops (autodiff.py holds the registry and the contract).

Binary ops broadcast as numpy does, so each operand's gradient is summed back to its own shape
(:func:`~fusiontune.ir.autodiff.sum_to`). A rule computes only the gradients its node needs
(``ctx.needs``): a constant exponent of Pow, say, never gets ``log(base)`` written for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fusiontune.ir.autodiff import VjpContext, is_float, mask, scalar, sum_to, vjp, where0
from fusiontune.ir.builder import GraphBuilder, Tensor

Grad = Callable[[], Tensor]


def _grads(c: VjpContext, *fns: Grad | None) -> list[Tensor | None]:
    """Run the gradient builders of the inputs that need one; sum each to its input's shape."""
    out: list[Tensor | None] = []
    for need, fn, x in zip(c.needs, fns, c.inputs, strict=True):
        out.append(sum_to(c.b, fn(), x.shape) if need and fn is not None else None)
    return out


# ---- binary ----------------------------------------------------------------------------------
@vjp("Add")
def _add(c: VjpContext) -> Sequence[Tensor | None]:
    return _grads(c, lambda: c.g, lambda: c.g)


@vjp("BiasAdd")
def _bias_add(c: VjpContext) -> Sequence[Tensor | None]:
    return _grads(c, lambda: c.g, lambda: c.g)


@vjp("Sub")
def _sub(c: VjpContext) -> Sequence[Tensor | None]:
    return _grads(c, lambda: c.g, lambda: c.b.neg(c.g))


@vjp("Mul")
def _mul(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, w) = c.b, c.inputs
    return _grads(c, lambda: b.mul(c.g, w), lambda: b.mul(c.g, x))


@vjp("Div")
def _div(c: VjpContext) -> Sequence[Tensor | None]:
    # d(a / b)/db = -a / b^2 = -y / b
    b, (_, d) = c.b, c.inputs
    return _grads(c, lambda: b.div(c.g, d), lambda: b.neg(b.div(b.mul(c.g, c.y()), d)))


@vjp("Pow")
def _pow(c: VjpContext) -> Sequence[Tensor | None]:
    # d(a^e)/da = e * a^(e - 1); d(a^e)/de = a^e * ln a (a > 0)
    b, (a, e) = c.b, c.inputs
    return _grads(
        c,
        lambda: b.mul(c.g, b.mul(e, b.pow(a, b.sub(e, 1.0)))),
        lambda: b.mul(c.g, b.mul(c.y(), b.log(a))),
    )


def _minmax(c: VjpContext, first_wins: str) -> Sequence[Tensor | None]:
    """Maximum / Minimum: the winner takes the gradient, a tie shares it evenly."""
    b, (x, w) = c.b, c.inputs
    dtype = c.g.dtype
    share = b.add(mask(b, b.op(first_wins, x, w), dtype), b.mul(mask(b, b.equal(x, w), dtype), 0.5))
    return _grads(c, lambda: b.mul(c.g, share), lambda: b.mul(c.g, b.sub(1.0, share)))


@vjp("Maximum")
def _maximum(c: VjpContext) -> Sequence[Tensor | None]:
    return _minmax(c, "Greater")


@vjp("Minimum")
def _minimum(c: VjpContext) -> Sequence[Tensor | None]:
    return _minmax(c, "Less")


@vjp("Mod")
def _mod(c: VjpContext) -> Sequence[Tensor | None]:
    # y = a - q * b with the quotient q = (a - y) / b (floored or truncated) piecewise constant.
    b, (x, d) = c.b, c.inputs
    return _grads(c, lambda: c.g, lambda: b.neg(b.mul(c.g, b.div(b.sub(x, c.y()), d))))


@vjp("PRelu")
def _prelu(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, slope) = c.b, c.inputs
    neg = b.less(x, 0.0)
    return _grads(
        c, lambda: b.where(neg, b.mul(c.g, slope), c.g), lambda: where0(b, neg, b.mul(c.g, x))
    )


@vjp("Where")
def _where(c: VjpContext) -> Sequence[Tensor | None]:
    b, (cond, _, _) = c.b, c.inputs
    return _grads(
        c, None, lambda: where0(b, cond, c.g), lambda: b.where(cond, scalar(b, 0.0, c.g.dtype), c.g)
    )


@vjp("SwiGlu")
def _swiglu(c: VjpContext) -> Sequence[Tensor | None]:
    # silu(gate) * up
    b, (gate, up) = c.b, c.inputs
    return _grads(
        c, lambda: b.mul(b.mul(c.g, up), _silu_grad(b, gate)), lambda: b.mul(c.g, b.silu(gate))
    )


@vjp("GeGlu")
def _geglu(c: VjpContext) -> Sequence[Tensor | None]:
    b, (gate, up) = c.b, c.inputs
    approx = c.attrs.get("approximate", "none")
    return _grads(
        c,
        lambda: b.mul(b.mul(c.g, up), _gelu_grad(b, gate, approx)),
        lambda: b.mul(c.g, b.gelu(gate, approx)),
    )


@vjp("BatchNorm")
def _batch_norm(c: VjpContext) -> Sequence[Tensor | None]:
    # y = (x - mean) * rstd * scale + bias, rstd = (var + eps)^-1/2, parameters (C, 1, ...)
    b, (x, scale, _, mean, var) = c.b, c.inputs
    rstd = b.rsqrt(b.add(var, float(c.attrs.get("eps", 1e-5))))
    centred = b.sub(x, mean)
    return _grads(
        c,
        lambda: b.mul(c.g, b.mul(scale, rstd)),
        lambda: b.mul(c.g, b.mul(centred, rstd)),
        lambda: c.g,
        lambda: b.neg(b.mul(c.g, b.mul(scale, rstd))),
        lambda: b.mul(
            b.mul(c.g, centred), b.mul(b.mul(scale, -0.5), b.mul(rstd, b.mul(rstd, rstd)))
        ),
    )


# ---- unary -----------------------------------------------------------------------------------
def _unary(op: str, grad: Callable[[VjpContext, GraphBuilder, Tensor], Tensor | None]) -> None:
    """Register ``op``'s rule: ``dx = grad(ctx, builder, x)`` (the whole gradient, not a factor)."""

    def rule(c: VjpContext) -> Sequence[Tensor | None]:
        return [grad(c, c.b, c.x())]

    vjp(op)(rule)


_SQRT_2 = float(np.sqrt(2.0))
_SQRT_2PI = float(np.sqrt(2.0 * np.pi))
_TANH_GELU_C = float(np.sqrt(2.0 / np.pi))


def _silu_grad(b: GraphBuilder, x: Tensor) -> Tensor:
    """silu'(x) = s * (1 + x * (1 - s)), s = sigmoid(x)."""
    s = b.sigmoid(x)
    return b.mul(s, b.add(1.0, b.mul(x, b.sub(1.0, s))))


def _gelu_grad(b: GraphBuilder, x: Tensor, approximate: str) -> Tensor:
    """gelu'(x): Phi(x) + x * phi(x) (exact), or the derivative of the tanh form."""
    if approximate == "tanh":
        # y = x/2 * (1 + t), t = tanh(u), u = c * (x + k x^3): y' = (1 + t)/2 + x/2 * (1 - t^2) * u'
        k = 0.044715
        x2 = b.mul(x, x)
        t = b.tanh(b.mul(b.add(x, b.mul(b.mul(x2, x), k)), _TANH_GELU_C))
        du = b.mul(b.add(b.mul(x2, 3.0 * k), 1.0), _TANH_GELU_C)
        return b.add(
            b.mul(b.add(t, 1.0), 0.5), b.mul(b.mul(b.mul(x, 0.5), b.sub(1.0, b.mul(t, t))), du)
        )
    cdf = b.mul(b.add(b.erf(b.div(x, _SQRT_2)), 1.0), 0.5)
    pdf = b.div(b.exp(b.mul(b.mul(x, x), -0.5)), _SQRT_2PI)
    return b.add(cdf, b.mul(x, pdf))


_unary("Neg", lambda c, b, x: b.neg(c.g))
# Relu and Gelu write their fused grad ops (ir/_ops_grad.py): ReluGrad reads the forward's output
# (y > 0 exactly where x > 0), GeluGrad the input; ReluGradFusionPass / GeluGradFusionPass keep
# them or expand them into primitives (the expansion is the rule's former form).
_unary("Relu", lambda c, b, x: b.op("ReluGrad", c.y(), c.g))
_unary("Reciprocal", lambda c, b, x: b.neg(b.mul(c.g, b.mul(c.y(), c.y()))))
_unary("Sqrt", lambda c, b, x: b.div(b.mul(c.g, 0.5), c.y()))
_unary("Rsqrt", lambda c, b, x: b.mul(c.g, b.mul(b.mul(c.y(), -0.5), b.mul(c.y(), c.y()))))
_unary("Exp", lambda c, b, x: b.mul(c.g, c.y()))
_unary("Log", lambda c, b, x: b.div(c.g, x))
_unary("Tanh", lambda c, b, x: b.mul(c.g, b.sub(1.0, b.mul(c.y(), c.y()))))
_unary(
    "Erf", lambda c, b, x: b.mul(c.g, b.mul(b.exp(b.neg(b.mul(x, x))), float(2.0 / np.sqrt(np.pi))))
)
_unary("Sigmoid", lambda c, b, x: b.mul(c.g, b.mul(c.y(), b.sub(1.0, c.y()))))
_unary("Silu", lambda c, b, x: b.mul(c.g, _silu_grad(b, x)))
_unary("Gelu", lambda c, b, x: b.op("GeluGrad", x, c.g, approximate=c.attrs.get("approximate", "none")))
_unary(
    "GeluCdf",
    # Phi' = phi (erf form); the tanh form's gate c = (1 + tanh u) / 2 has c' = 2 c (1 - c) u'.
    lambda c, b, x: b.mul(c.g, b.div(b.exp(b.mul(b.mul(x, x), -0.5)), _SQRT_2PI))
    if c.attrs.get("approximate", "none") != "tanh"
    else b.mul(
        c.g,
        b.mul(
            b.mul(b.mul(c.y(), b.sub(1.0, c.y())), 2.0),
            b.mul(b.add(b.mul(b.mul(x, x), 3.0 * 0.044715), 1.0), _TANH_GELU_C),
        ),
    ),
)
_unary("Abs", lambda c, b, x: b.mul(c.g, b.op("Sign", x)))
_unary("Cos", lambda c, b, x: b.neg(b.mul(c.g, b.op("Sin", x))))
_unary("Sin", lambda c, b, x: b.mul(c.g, b.op("Cos", x)))
_unary("Softplus", lambda c, b, x: b.mul(c.g, b.sigmoid(x)))
_unary(
    "Clip",
    lambda c, b, x: where0(
        b,
        b.op(
            "And",
            b.op("GreaterOrEqual", x, float(c.attrs["min"])),
            b.op("LessOrEqual", x, float(c.attrs["max"])),
        ),
        c.g,
    ),
)
_unary(
    "LeakyRelu",
    lambda c, b, x: b.where(
        b.op("GreaterOrEqual", x, 0.0), c.g, b.mul(c.g, float(c.attrs["alpha"]))
    ),
)


def _hard_sigmoid(c: VjpContext, b: GraphBuilder, x: Tensor) -> Tensor:
    alpha, beta = float(c.attrs["alpha"]), float(c.attrs["beta"])
    z = b.add(b.mul(x, alpha), beta)
    return where0(b, b.op("And", b.greater(z, 0.0), b.less(z, 1.0)), b.mul(c.g, alpha))


def _hard_swish(c: VjpContext, b: GraphBuilder, x: Tensor) -> Tensor:
    # y = x * h(x), h = clip(x / 6 + 1/2, 0, 1): y' = h + x / 6 on (-3, 3)
    h = b.op("HardSigmoid", x, alpha=1.0 / 6.0, beta=0.5)
    inside = b.op("And", b.greater(x, -3.0), b.less(x, 3.0))
    return b.mul(c.g, b.add(h, where0(b, inside, b.mul(x, 1.0 / 6.0))))


def _elu(c: VjpContext, b: GraphBuilder, x: Tensor) -> Tensor:
    alpha = float(c.attrs["alpha"])
    return b.where(b.op("GreaterOrEqual", x, 0.0), c.g, b.mul(c.g, b.mul(b.exp(x), alpha)))


def _selu(c: VjpContext, b: GraphBuilder, x: Tensor) -> Tensor:
    gamma, alpha = float(c.attrs["gamma"]), float(c.attrs["alpha"])
    return b.where(b.greater(x, 0.0), b.mul(c.g, gamma), b.mul(c.g, b.mul(b.exp(x), gamma * alpha)))


def _cast(c: VjpContext, b: GraphBuilder, x: Tensor) -> Tensor | None:
    # Float to float: the gradient goes back in the input's dtype. From a bool or an integer there
    # is nothing to differentiate (and the autodiff never asks: such an input is never active).
    if is_float(x.dtype):
        return b.cast(c.g, x.dtype)
    return None


_unary("HardSigmoid", _hard_sigmoid)
_unary("HardSwish", _hard_swish)
_unary("Elu", _elu)
_unary("Selu", _selu)
_unary("Cast", _cast)
