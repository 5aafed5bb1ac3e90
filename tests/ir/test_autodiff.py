"""Reverse-mode autodiff (ir/autodiff.py): every VJP rule against float64 central differences.

:data:`CASES` holds small one-op graphs (broadcasting, several axes, every attribute that changes
the backward: strides, pads, groups, ceil_mode, modes, reductions...). Each one is differentiated
with :func:`grad_graph` against random cotangents and checked against central finite differences
of ``sum(cotangent * output)`` run by the float64 interpreter. Inputs keep away from the points
where an op is not differentiable (the kinks of Relu, Clip, HardSwish; the jumps of Mod), so the
finite differences are exact up to rounding. Then a property test draws random small graphs of
the differentiable ops and checks them the same way.

Adding an op to the catalogue without a VJP rule or a NON_DIFFERENTIABLE entry fails
:func:`test_every_catalogue_op_has_a_rule_or_is_declared_non_differentiable`; a rule without a case
here fails :func:`test_every_rule_has_a_finite_difference_case`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fusiontune.ir import CATALOGUE, Graph, GraphBuilder, Tensor, random_inputs, run_graph
from fusiontune.ir.autodiff import (
    MISSING_RULES,
    NON_DIFFERENTIABLE,
    VJP_RULES,
    cotangent_name,
    grad_graph,
    gradient_name,
)

H = 1e-6  # central-difference step (float64)
RTOL, ATOL = 1e-5, 1e-6

Inputs = Callable[[np.random.Generator], "dict[str, np.ndarray]"]


# ---- the finite-difference check -----------------------------------------------------------------
def _with_constant(graph: Graph, name: str, array: np.ndarray) -> Graph:
    return dataclasses.replace(graph, constants={**graph.constants, name: array})


def numeric_gradients(
    graph: Graph, wrt: Sequence[str], feed: Mapping[str, np.ndarray], cot: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Central differences of ``sum(cot[o] * o)`` over the outputs, w.r.t. inputs or constants."""

    def loss(g: Graph, f: Mapping[str, np.ndarray]) -> float:
        outs = run_graph(g, f)
        return float(sum(np.sum(c * outs[o]) for o, c in cot.items()))

    grads = {}
    for name in wrt:
        base = np.array(feed[name] if name in feed else graph.constants[name], dtype=np.float64)
        num = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            vals = []
            for step in (H, -H):
                moved = base.copy()
                moved[i] += step
                if name in feed:
                    vals.append(loss(graph, {**feed, name: moved}))
                else:
                    vals.append(loss(_with_constant(graph, name, moved), feed))
            num[i] = (vals[0] - vals[1]) / (2 * H)
        grads[name] = num
    return grads


def check_gradients(
    graph: Graph,
    feed: Mapping[str, np.ndarray],
    wrt: Sequence[str] | None = None,
    seed: int = 0,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> None:
    """:func:`grad_graph` of ``graph`` agrees with central differences (float64 interpreter)."""
    if wrt is None:
        wrt = [n for n in graph.inputs if graph.values[n].dtype.startswith("float")]
    backward = grad_graph(graph, wrt)
    rng = np.random.default_rng(seed + 1000)
    cot = {
        o: rng.standard_normal(graph.values[o].shape)
        for o in dict.fromkeys(graph.outputs)
        if cotangent_name(o) in backward.inputs
    }
    got = run_graph(backward, {**feed, **{cotangent_name(o): c for o, c in cot.items()}})
    want = numeric_gradients(graph, wrt, feed, cot)
    for name in wrt:
        np.testing.assert_allclose(
            got[gradient_name(name)],
            want[name],
            rtol=rtol,
            atol=atol,
            err_msg=f"gradient of {name}",
        )


# ---- one-op cases -------------------------------------------------------------------------------
KINKS = (0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 3.0, -3.0)  # Relu, Clip, HardSigmoid, HardSwish...


def away(x: np.ndarray, margin: float = 0.05) -> np.ndarray:
    """``x`` with every element moved at least ``margin`` away from the kinks of the catalogue."""
    x = np.array(x, dtype=np.float64)
    for _ in range(4):
        for k in KINKS:
            near = np.abs(x - k) < margin
            x[near] = k + 2 * margin * np.where(x[near] >= k, 1.0, -1.0)
    return x


@dataclass(frozen=True)
class GradCase:
    """One small float64 graph around one op.

    Attributes:
        op: the op whose rule is under test.
        id: the pytest id.
        build: adds inputs, constants and the op to a builder; returns the outputs.
        domain: how float inputs are drawn: ``normal`` (kept off the kinks) or ``positive``
            (uniform in [0.5, 2]).
        inputs: explicit input values (overrides ``domain`` for the names it gives).
        wrt: what to differentiate; None: every float input.
    """

    op: str
    id: str
    build: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]]
    domain: str = "normal"
    inputs: Inputs | None = None
    wrt: tuple[str, ...] | None = None

    def graph(self) -> Graph:
        b = GraphBuilder(self.id, "float64")
        out = self.build(b)
        b.output(*(out if isinstance(out, tuple) else (out,)))
        return b.build()

    def feed(self, graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
        given_ = self.inputs(rng) if self.inputs else {}
        feed = {}
        for name in graph.inputs:
            v = graph.values[name]
            if name in given_:
                feed[name] = np.asarray(given_[name], dtype=v.dtype)
            elif self.domain == "positive":
                feed[name] = rng.uniform(0.5, 2.0, v.shape)
            else:
                feed[name] = away(rng.standard_normal(v.shape))
        return feed


def _c(b: GraphBuilder, array: object, dtype: str | None = None) -> Tensor:
    return b.const(np.asarray(array), dtype=dtype)


def _unary(
    op: str, domain: str = "normal", shape: tuple[int, ...] = (2, 3), **attrs: object
) -> GradCase:
    suffix = "-".join(f"{k}={v}" for k, v in attrs.items())
    return GradCase(
        op,
        f"{op}{'-' + suffix if suffix else ''}",
        lambda b: b.op(op, b.input("x", shape), **attrs),
        domain,
    )


def _binary(op: str, sa: tuple[int, ...], sb: tuple[int, ...], domain: str = "normal") -> GradCase:
    return GradCase(
        op, f"{op}-{sa}-{sb}", lambda b: b.op(op, b.input("a", sa), b.input("b", sb)), domain
    )


def _mod_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    # a = b * (q + f) with f in [0.2, 0.8]: the quotient is never near a jump
    d = rng.uniform(0.5, 2.0, (2, 3)) * rng.choice([-1.0, 1.0], (2, 3))
    return {"b": d, "a": d * (rng.integers(-3, 3, (2, 3)) + rng.uniform(0.2, 0.8, (2, 3)))}


def _attention(b: GraphBuilder) -> Tensor:
    q, k, v = b.input("q", (2, 1, 3, 4)), b.input("k", (2, 2, 5, 4)), b.input("v", (1, 2, 5, 3))
    return b.op("Attention", q, k, v, b.input("mask", (3, 5)), scale=0.5)


def _scatter(reduction: str, idx: list[list[int]]) -> GradCase:
    def build(b: GraphBuilder) -> Tensor:
        i = _c(b, idx, "int64")
        return b.op(
            "ScatterND",
            b.input("data", (4, 3)),
            i,
            b.input("upd", (len(idx), 3)),
            reduction=reduction,
        )

    return GradCase(
        "ScatterND", f"ScatterND-{reduction}", build, "positive" if reduction == "mul" else "normal"
    )


def _conv(sx: tuple[int, ...], sw: tuple[int, ...], bias: bool = True, **attrs: object) -> GradCase:
    def build(b: GraphBuilder) -> Tensor:
        ins = [b.input("x", sx), b.input("w", sw)] + ([b.input("bias", (sw[0],))] if bias else [])
        return b.op("Conv", *ins, **attrs)

    return GradCase("Conv", f"Conv-{sx}-{sw}-{attrs}", build)


def _conv_t(sx: tuple[int, ...], sw: tuple[int, ...], **attrs: object) -> GradCase:
    def build(b: GraphBuilder) -> Tensor:
        m = sw[1] * int(attrs.get("group", 1))  # type: ignore[call-overload]
        return b.op(
            "ConvTranspose", b.input("x", sx), b.input("w", sw), b.input("bias", (m,)), **attrs
        )

    return GradCase("ConvTranspose", f"ConvTranspose-{sx}-{sw}-{attrs}", build)


def _pool(op: str, shape: tuple[int, ...], **attrs: object) -> GradCase:
    return GradCase(op, f"{op}-{shape}-{attrs}", lambda b: b.op(op, b.input("x", shape), **attrs))


CASES: list[GradCase] = [
    # binary, with broadcasting both ways
    _binary("Add", (2, 3), (3,)),
    _binary("Add", (2, 1, 3), (4, 1)),
    _binary("Sub", (2, 3), (2, 1)),
    _binary("Mul", (1, 3), (2, 1)),
    _binary("Div", (2, 3), (3,), "positive"),
    _binary("Pow", (2, 3), (2, 3), "positive"),
    GradCase("Pow", "Pow-constant-exponent", lambda b: b.pow(b.input("x", (2, 3)), 3.0)),
    _binary("Maximum", (2, 3), (3,)),
    _binary("Minimum", (2, 3), (2, 1)),
    GradCase(
        "Maximum",
        "Maximum-same-operand",
        lambda b: (lambda x: b.maximum(x, x))(b.input("x", (2, 3))),
    ),
    GradCase(
        "Minimum",
        "Minimum-same-operand",
        lambda b: (lambda x: b.minimum(x, x))(b.input("x", (2, 3))),
    ),
    GradCase(
        "Mod",
        "Mod-floor",
        lambda b: b.op("Mod", b.input("a", (2, 3)), b.input("b", (2, 3))),
        inputs=_mod_inputs,
    ),
    GradCase(
        "Mod",
        "Mod-fmod",
        lambda b: b.op("Mod", b.input("a", (2, 3)), b.input("b", (2, 3)), fmod=1),
        inputs=_mod_inputs,
    ),
    GradCase(
        "PRelu", "PRelu", lambda b: b.op("PRelu", b.input("x", (2, 3)), b.input("slope", (3,)))
    ),
    GradCase(
        "BiasAdd", "BiasAdd", lambda b: b.bias_add(b.input("x", (2, 2, 3)), b.input("bias", (3,)))
    ),
    GradCase(
        "Where",
        "Where-broadcast",
        lambda b: b.where(
            _c(b, [[True, False, True], [False, False, True]]),
            b.input("a", (2, 3)),
            b.input("b", (3,)),
        ),
    ),
    _binary("SwiGlu", (2, 3), (2, 3)),
    GradCase(
        "GeGlu", "GeGlu-none", lambda b: b.op("GeGlu", b.input("g", (2, 3)), b.input("u", (3,)))
    ),
    GradCase(
        "GeGlu",
        "GeGlu-tanh",
        lambda b: b.op("GeGlu", b.input("g", (2, 3)), b.input("u", (2, 3)), approximate="tanh"),
    ),
    GradCase(
        "BatchNorm",
        "BatchNorm",
        lambda b: b.op(
            "BatchNorm",
            b.input("x", (2, 3, 2, 2)),
            *(b.input(n, (3, 1, 1)) for n in ("scale", "bias", "mean", "var")),
            eps=1e-3,
        ),
        inputs=lambda r: {"var": r.uniform(0.5, 2.0, (3, 1, 1))},
    ),
    # unary
    _unary("Neg"),
    _unary("Relu"),
    _unary("Reciprocal", "positive"),
    _unary("Sqrt", "positive"),
    _unary("Rsqrt", "positive"),
    _unary("Exp"),
    _unary("Log", "positive"),
    _unary("Tanh"),
    _unary("Erf"),
    _unary("Sigmoid"),
    _unary("Silu"),
    _unary("Gelu"),
    _unary("Gelu", approximate="tanh"),
    _unary("GeluCdf"),
    _unary("GeluCdf", approximate="tanh"),
    _unary("Clip", min=-0.5, max=0.5),
    _unary("Clip", shape=(4, 3)),
    _unary("LeakyRelu", alpha=0.1),
    GradCase(
        "HardSigmoid",
        "HardSigmoid",
        lambda b: b.op("HardSigmoid", b.input("x", (4, 3))),
        inputs=lambda r: {"x": away(r.uniform(-4, 4, (4, 3)))},
    ),
    GradCase(
        "HardSwish",
        "HardSwish",
        lambda b: b.op("HardSwish", b.input("x", (4, 3))),
        inputs=lambda r: {"x": away(r.uniform(-5, 5, (4, 3)))},
    ),
    _unary("Abs"),
    _unary("Cos"),
    _unary("Sin"),
    _unary("Softplus"),
    _unary("Elu", alpha=0.7),
    _unary("Selu"),
    GradCase(
        "Cast",
        "Cast-float32",
        lambda b: b.mul(b.cast(b.input("x", (2, 3)), "float32"), _c(b, np.ones(3), "float32")),
    ),
    # reductions and normalizations
    GradCase(
        "ReduceSum",
        "ReduceSum-axes-0-2",
        lambda b: b.reduce_sum(b.input("x", (2, 3, 2)), (0, 2), keepdims=False),
    ),
    GradCase(
        "ReduceSum",
        "ReduceSum-all",
        lambda b: b.op("ReduceSum", b.input("x", (2, 3)), keepdims=True),
    ),
    GradCase(
        "ReduceMean", "ReduceMean-axis-1", lambda b: b.reduce_mean(b.input("x", (2, 3, 2)), 1)
    ),
    GradCase(
        "ReduceMean",
        "ReduceMean-all-flat",
        lambda b: b.op("ReduceMean", b.input("x", (2, 3)), keepdims=False),
    ),
    GradCase(
        "ReduceMax",
        "ReduceMax-axis-1",
        lambda b: b.reduce_max(b.input("x", (2, 4, 2)), 1, keepdims=False),
    ),
    GradCase(
        "ReduceMax",
        "ReduceMax-ties-of-copies",
        lambda b: (lambda x: b.reduce_max(b.concat([x, x], 1), 1))(b.input("x", (2, 3))),
    ),
    GradCase("Softmax", "Softmax-last", lambda b: b.softmax(b.input("x", (2, 4)))),
    GradCase("Softmax", "Softmax-axis-0", lambda b: b.softmax(b.input("x", (3, 2, 2)), 0)),
    GradCase(
        "LogSoftmax", "LogSoftmax", lambda b: b.op("LogSoftmax", b.input("x", (2, 4)), axis=1)
    ),
    GradCase(
        "LayerNorm",
        "LayerNorm",
        lambda b: b.layer_norm(b.input("x", (2, 5)), b.input("gamma", (5,)), b.input("beta", (5,))),
    ),
    GradCase(
        "LayerNorm",
        "LayerNorm-one_pass-row-params",
        lambda b: b.op(
            "LayerNorm",
            b.input("x", (2, 2, 4)),
            b.input("gamma", (1, 4)),
            b.input("beta", (2, 1, 4)),
            variance="one_pass",
            eps=1e-3,
        ),
    ),
    GradCase(
        "RMSNorm", "RMSNorm", lambda b: b.rms_norm(b.input("x", (3, 4)), b.input("gamma", (4,)))
    ),
    # The fused backward ops (second derivatives, through their expansions); saved statistics
    # are inputs in (0.5, 2), as an rstd is.
    GradCase(
        "SoftmaxGrad",
        "SoftmaxGrad-axis-0",
        lambda b: b.op("SoftmaxGrad", b.input("y", (3, 2)), b.input("dy", (3, 2)), axis=0),
    ),
    GradCase(
        "LayerNormGrad",
        "LayerNormGrad-recompute",
        lambda b: b.op(
            "LayerNormGrad", b.input("x", (2, 4)), b.input("gamma", (4,)), b.input("dy", (2, 4)),
            n_outputs=2,
        ),
    ),
    GradCase(
        "LayerNormGrad",
        "LayerNormGrad-saved",
        lambda b: b.op(
            "LayerNormGrad", b.input("x", (2, 3)), b.input("gamma", (1, 3)), b.input("dy", (2, 3)),
            b.input("mean", (2, 1)), b.input("rstd", (2, 1)), n_outputs=2,
        ),
        inputs=lambda rng: {"rstd": rng.uniform(0.5, 2.0, (2, 1))},
    ),
    GradCase(
        "RmsNormGrad",
        "RmsNormGrad-saved",
        lambda b: b.op(
            "RmsNormGrad", b.input("x", (2, 3)), b.input("gamma", (3,)), b.input("dy", (2, 3)),
            b.input("rstd", (2, 1)), n_outputs=2,
        ),
        inputs=lambda rng: {"rstd": rng.uniform(0.5, 2.0, (2, 1))},
    ),
    GradCase(
        "GeluGrad",
        "GeluGrad-saved-cdf-tanh",
        lambda b: b.op(
            "GeluGrad", b.input("x", (2, 3)), b.input("dy", (2, 3)), b.input("c", (2, 3)),
            approximate="tanh",
        ),
    ),
    GradCase(
        "GeluGrad",
        "GeluGrad",
        lambda b: b.op("GeluGrad", b.input("x", (2, 3)), b.input("dy", (2, 3))),
    ),
    GradCase(
        "ReluGrad", "ReluGrad", lambda b: b.op("ReluGrad", b.input("y", (2, 3)), b.input("dy", (2, 3)))
    ),
    GradCase(
        "AttentionGrad",
        "AttentionGrad-masked",
        lambda b: b.op(
            "AttentionGrad", b.input("q", (1, 2, 3)), b.input("k", (1, 3, 3)), b.input("v", (1, 3, 2)),
            b.input("dy", (1, 2, 2)), b.input("mask", (2, 3)), n_outputs=3, scale=0.7,
        ),
    ),
    GradCase(
        "AddLayerNorm",
        "AddLayerNorm",
        lambda b: b.op(
            "AddLayerNorm",
            b.input("a", (2, 4)),
            b.input("b", (4,)),
            b.input("gamma", (4,)),
            b.input("beta", (4,)),
            n_outputs=2,
        ),
    ),
    GradCase(
        "AddLayerNorm",
        "AddLayerNorm-norm-only",
        lambda b: b.op(
            "AddLayerNorm",
            b.input("a", (2, 4)),
            b.input("b", (2, 4)),
            b.input("gamma", (4,)),
            b.input("beta", (4,)),
            n_outputs=2,
        )[0],
    ),
    GradCase(
        "AddRmsNorm",
        "AddRmsNorm",
        lambda b: b.op(
            "AddRmsNorm",
            b.input("a", (2, 4)),
            b.input("b", (2, 4)),
            b.input("gamma", (4,)),
            n_outputs=2,
        ),
    ),
    GradCase(
        "AddRmsNorm",
        "AddRmsNorm-sum-only",
        lambda b: b.op(
            "AddRmsNorm",
            b.input("a", (2, 4)),
            b.input("b", (2, 4)),
            b.input("gamma", (4,)),
            n_outputs=2,
        )[1],
    ),
    # contractions
    _binary("MatMul", (3, 4), (4, 2)),
    _binary("MatMul", (2, 3, 4), (4, 2)),
    _binary("MatMul", (3, 4), (2, 1, 4, 2)),
    GradCase(
        "MatMul",
        "MatMul-bias",
        lambda b: b.matmul(b.input("a", (3, 4)), b.input("w", (4, 2)), b.input("bias", (2,))),
    ),
    _conv((2, 2, 5, 4), (3, 2, 3, 2), strides=(2, 1), pads=(1, 0, 1, 1)),
    _conv((1, 2, 7), (2, 2, 2), bias=False, strides=(3,), dilations=(2,), pads=(2, 1)),
    _conv((1, 4, 4, 3), (4, 2, 2, 2), group=2, pads=(0, 1, 1, 0), dilations=(2, 1)),
    _conv((1, 2, 3, 3, 4), (2, 1, 2, 2, 2), group=2, strides=(1, 2, 1), pads=(1, 0, 0, 0, 1, 1)),
    _conv_t((1, 2, 3, 2), (2, 3, 2, 2), strides=(2, 1), pads=(1, 0, 0, 1), output_padding=(1, 0)),
    _conv_t((2, 4, 3), (4, 1, 3), group=2, strides=(2,), dilations=(2,), pads=(1, 2)),
    _pool("MaxPool", (1, 2, 4, 4), kernel_shape=(2, 2), strides=(2, 2)),
    _pool(
        "MaxPool", (2, 1, 5, 4), kernel_shape=(3, 2), strides=(2, 1), pads=(1, 1, 1, 0), ceil_mode=1
    ),
    _pool("MaxPool", (1, 2, 6), kernel_shape=(2,), dilations=(2,), pads=(1, 0)),
    _pool("AveragePool", (1, 2, 4, 4), kernel_shape=(2, 2), strides=(2, 2)),
    _pool(
        "AveragePool",
        (1, 1, 5, 4),
        kernel_shape=(3, 2),
        strides=(2, 2),
        pads=(1, 1, 1, 0),
        ceil_mode=1,
    ),
    _pool(
        "AveragePool",
        (1, 1, 5, 4),
        kernel_shape=(3, 2),
        strides=(2, 2),
        pads=(1, 1, 1, 1),
        ceil_mode=1,
        count_include_pad=1,
    ),
    GradCase("Attention", "Attention-mask-broadcast", _attention),
    GradCase(
        "Attention",
        "Attention-no-mask",
        lambda b: b.op(
            "Attention", b.input("q", (2, 3)), b.input("k", (4, 3)), b.input("v", (4, 2)), scale=0.7
        ),
    ),
    GradCase(
        "RotaryPositionEmbedding",
        "Rotary-halves",
        lambda b: b.op(
            "RotaryPositionEmbedding",
            b.input("x", (2, 3, 4)),
            b.input("cos", (3, 4)),
            b.input("sin", (3, 4)),
        ),
    ),
    GradCase(
        "RotaryPositionEmbedding",
        "Rotary-pairs",
        lambda b: b.op(
            "RotaryPositionEmbedding",
            b.input("x", (2, 3, 4)),
            b.input("cos", (1, 3, 4)),
            b.input("sin", (3, 4)),
            mode=1,
        ),
    ),
    # layout and index ops
    GradCase("Reshape", "Reshape", lambda b: b.reshape(b.input("x", (2, 3, 2)), (3, -1))),
    GradCase("Transpose", "Transpose", lambda b: b.transpose(b.input("x", (2, 3, 2)), (2, 0, 1))),
    GradCase(
        "Transpose", "Transpose-default", lambda b: b.op("Transpose", b.input("x", (2, 3, 4)))
    ),
    GradCase(
        "Concat",
        "Concat",
        lambda b: b.concat([b.input("a", (2, 1)), b.input("b", (2, 3)), b.input("c", (2, 2))], -1),
    ),
    GradCase("Split", "Split", lambda b: b.split(b.input("x", (2, 6)), (1, 2, 3), 1)),
    GradCase("Split", "Split-one-used", lambda b: b.split(b.input("x", (4, 2)), (1, 3), 0)[1]),
    GradCase(
        "Slice",
        "Slice-contiguous",
        lambda b: b.slice(b.input("x", (4, 5)), [1, 1], [3, -1], [0, 1]),
    ),
    GradCase(
        "Slice",
        "Slice-strided",
        lambda b: b.slice(b.input("x", (4, 5)), [0, 4], [4, 0], [0, 1], [2, -2]),
    ),
    GradCase(
        "Slice",
        "Slice-reversed-clamped",
        lambda b: b.slice(b.input("x", (3, 4)), [100], [-100], [1], [-1]),
    ),
    GradCase("Expand", "Expand", lambda b: b.expand(b.input("x", (3, 1)), (2, 3, 4))),
    GradCase(
        "Gather",
        "Gather-axis-1-repeats",
        lambda b: b.op(
            "Gather", b.input("x", (2, 4, 2)), _c(b, [[0, 3], [-1, 0], [2, 2]], "int64"), axis=1
        ),
    ),
    GradCase(
        "Gather",
        "Gather-scalar-index",
        lambda b: b.op("Gather", b.input("x", (3, 2)), _c(b, 1, "int64")),
    ),
    GradCase(
        "GatherND",
        "GatherND",
        lambda b: b.op(
            "GatherND", b.input("x", (3, 2, 2)), _c(b, [[0, 1], [2, 0], [0, 1]], "int64")
        ),
    ),
    GradCase(
        "GatherND",
        "GatherND-batch",
        lambda b: b.op(
            "GatherND",
            b.input("x", (2, 3, 2)),
            _c(b, [[[1], [-1]], [[0], [0]]], "int64"),
            batch_dims=1,
        ),
    ),
    GradCase(
        "GatherElements",
        "GatherElements",
        lambda b: b.op(
            "GatherElements", b.input("x", (3, 3)), _c(b, [[0, 2, 2], [-1, 0, 1]], "int64"), axis=0
        ),
    ),
    GradCase(
        "GatherElements",
        "GatherElements-axis-1",
        lambda b: b.op(
            "GatherElements", b.input("x", (2, 3)), _c(b, [[0, 0], [2, 1]], "int64"), axis=1
        ),
    ),
    _scatter("none", [[1], [3], [1]]),
    _scatter("add", [[1], [3], [1]]),
    _scatter("mul", [[0], [2], [0]]),
    _scatter("max", [[1], [-1], [1]]),
    _scatter("min", [[2], [0]]),
    GradCase("CumSum", "CumSum", lambda b: b.op("CumSum", b.input("x", (2, 4)), axis=1)),
    GradCase(
        "CumSum",
        "CumSum-exclusive-reverse",
        lambda b: b.op("CumSum", b.input("x", (3, 2)), axis=0, exclusive=1, reverse=1),
    ),
    GradCase(
        "Trilu", "Trilu-lower", lambda b: b.op("Trilu", b.input("x", (2, 3, 3)), upper=0, k=1)
    ),
    GradCase("Tile", "Tile", lambda b: b.op("Tile", b.input("x", (2, 3)), repeats=(2, 3))),
    GradCase(
        "Pad",
        "Pad-constant-crop",
        lambda b: b.op("Pad", b.input("x", (3, 4)), pads=(1, -1, 2, 0), value=1.5),
    ),
    GradCase(
        "Pad",
        "Pad-reflect",
        lambda b: b.op("Pad", b.input("x", (3, 4)), pads=(2, 1, 1, -1), mode="reflect"),
    ),
    GradCase(
        "Pad",
        "Pad-edge",
        lambda b: b.op("Pad", b.input("x", (2, 3)), pads=(0, 2, 1, 3), mode="edge"),
    ),
    GradCase(
        "Pad",
        "Pad-wrap",
        lambda b: b.op("Pad", b.input("x", (2, 3)), pads=(1, 4, 0, -1), mode="wrap"),
    ),
]


def test_every_catalogue_op_has_a_rule_or_is_declared_non_differentiable() -> None:
    undecided = set(CATALOGUE) - set(VJP_RULES) - set(NON_DIFFERENTIABLE) - set(MISSING_RULES)
    assert not undecided, (
        f"ops with no VJP rule and no NON_DIFFERENTIABLE entry: {sorted(undecided)}"
    )
    assert not set(VJP_RULES) & set(NON_DIFFERENTIABLE)
    assert not set(MISSING_RULES) & (set(VJP_RULES) | set(NON_DIFFERENTIABLE))
    assert set(VJP_RULES) | set(NON_DIFFERENTIABLE) <= set(CATALOGUE), (
        "a rule for an op the catalogue lacks"
    )


def test_no_op_is_missing_a_rule() -> None:
    assert MISSING_RULES == {}


def test_every_rule_has_a_finite_difference_case() -> None:
    assert set(VJP_RULES) <= {c.op for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_vjp_matches_finite_differences(case: GradCase) -> None:
    graph = case.graph()
    assert case.op in graph.op_counts()
    feed = case.feed(graph, np.random.default_rng(7))
    check_gradients(graph, feed, case.wrt)


# ---- the contract of grad_graph ----------------------------------------------------------------
def _mlp() -> Graph:
    b = GraphBuilder("mlp", "float64")
    x = b.input("x", (4, 3))
    w = b.const(np.random.default_rng(0).standard_normal((3, 2)), name="w")
    h = b.gelu(b.matmul(x, w))
    b.output(b.reduce_mean(b.mul(h, h), (0, 1), keepdims=False))
    return b.build()


def test_grad_graph_of_a_scalar_loss_seeds_one_and_differentiates_weights() -> None:
    graph = _mlp()
    backward = grad_graph(graph, ["x", "w"], loss=graph.outputs[0])
    assert backward.inputs == graph.inputs  # no cotangent input for a scalar loss
    assert backward.outputs == (*graph.outputs, gradient_name("x"), gradient_name("w"))
    assert backward.values[gradient_name("w")].shape == (3, 2)
    feed = {"x": np.random.default_rng(1).standard_normal((4, 3))}
    got = run_graph(backward, feed)
    want = numeric_gradients(graph, ["x", "w"], feed, {graph.outputs[0]: np.ones(())})
    np.testing.assert_allclose(got[gradient_name("w")], want["w"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[gradient_name("x")], want["x"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[graph.outputs[0]], run_graph(graph, feed)[graph.outputs[0]])


def test_grad_graph_without_forward_outputs_drops_what_the_gradients_do_not_need() -> None:
    b = GraphBuilder("side", "float64")
    x = b.input("x", (2, 3))
    b.output(b.mul(x, 3.0), b.exp(b.input("y", (2, 3))))
    graph = b.build()
    backward = grad_graph(graph, ["x"], keep_outputs=False)
    assert backward.outputs == (gradient_name("x"),)
    assert "Exp" not in backward.op_counts()
    assert cotangent_name(graph.outputs[1]) not in backward.inputs  # Exp(y) does not depend on x


def test_grad_graph_gives_zeros_for_a_value_the_outputs_do_not_depend_on() -> None:
    b = GraphBuilder("cut", "float64")
    x = b.input("x", (2, 3))
    # the gradient stops at an integer cast and at a comparison
    stopped = b.add(b.cast(b.cast(x, "int64"), "float64"), b.cast(b.greater(x, 0.0), "float64"))
    b.output(b.add(stopped, b.input("z", (2, 3))))
    graph = b.build()
    backward = grad_graph(graph, ["x", "z"])
    feed = {
        "x": np.ones((2, 3)),
        "z": np.ones((2, 3)),
        cotangent_name(graph.outputs[0]): np.full((2, 3), 2.0),
    }
    got = run_graph(backward, feed)
    np.testing.assert_array_equal(got[gradient_name("x")], np.zeros((2, 3)))
    np.testing.assert_array_equal(got[gradient_name("z")], np.full((2, 3), 2.0))


def test_grad_graph_accumulates_every_use_and_names_shared_gradients_apart() -> None:
    b = GraphBuilder("uses", "float64")
    x, y = b.input("x", (3,)), b.input("y", (3,))
    b.output(b.add(b.mul(x, x), b.add(x, y)), b.add(x, y))
    graph = b.build()
    check_gradients(graph, {"x": np.array([0.3, -1.2, 2.0]), "y": np.array([1.0, 2.0, 3.0])})
    # the gradient of an intermediate value counts its own uses only
    inner = graph.nodes[0].outputs[0]
    backward = grad_graph(graph, [inner, "y"])
    assert backward.outputs[-2:] == (gradient_name(inner), gradient_name("y"))


def test_grad_graph_runs_in_the_graphs_own_float32() -> None:
    b = GraphBuilder("f32", "float32")
    x = b.input("x", (2, 4))
    b.output(b.reduce_sum(b.softmax(b.mul(x, x)), (0, 1), keepdims=False))
    graph = b.build()
    backward = grad_graph(graph, ["x"], loss=graph.outputs[0])
    assert backward.values[gradient_name("x")].dtype == "float32"
    feed = {"x": np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)}
    f32 = run_graph(backward, feed, dtype=None)[gradient_name("x")]
    f64 = run_graph(backward, feed)[gradient_name("x")]
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, f64, rtol=1e-4, atol=1e-5)


def test_grad_graph_differentiates_its_own_backward() -> None:
    # a Hessian-vector product: the backward of the backward, against differences of gradients
    b = GraphBuilder("hvp", "float64")
    x = b.input("x", (2, 4))
    w = b.const(np.random.default_rng(2).standard_normal((4, 4)) * 0.5)
    y = b.softmax(b.layer_norm(b.matmul(b.tanh(x), w), b.const(np.ones(4)), b.const(np.zeros(4))))
    b.output(b.reduce_sum(b.mul(y, b.const(np.arange(8.0).reshape(2, 4))), (0, 1), keepdims=False))
    graph = b.build()
    first = grad_graph(graph, ["x"], loss=graph.outputs[0], keep_outputs=False)
    direction = np.random.default_rng(3).standard_normal((2, 4))
    b2 = GraphBuilder("hvp2", "float64")
    x2 = b2.input("x", (2, 4))
    # rebuild the first backward inside a new builder, then take <grad, direction> as the loss
    env = {"x": x2}
    for name, arr in first.constants.items():
        env[name] = b2.const(arr)
    for node in first.nodes:
        outs = b2.op(
            node.op, *(env[i] for i in node.inputs), n_outputs=len(node.outputs), **dict(node.attrs)
        )
        for o, t in zip(node.outputs, outs if len(node.outputs) > 1 else (outs,), strict=True):
            env[o] = t
    b2.output(
        b2.reduce_sum(b2.mul(env[gradient_name("x")], b2.const(direction)), (0, 1), keepdims=False)
    )
    second = grad_graph(b2.build(), ["x"], loss=b2.outputs[0], prefix="hvp/")
    feed = {"x": np.random.default_rng(4).standard_normal((2, 4))}
    got = run_graph(second, feed)[gradient_name("x", "hvp/")]

    def gradient(at: np.ndarray) -> np.ndarray:
        return run_graph(first, {"x": at})[gradient_name("x")]

    want = (gradient(feed["x"] + 1e-5 * direction) - gradient(feed["x"] - 1e-5 * direction)) / 2e-5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="another prefix"):
        grad_graph(first, ["x"])


def test_grad_graph_refuses_bad_requests() -> None:
    graph = _mlp()
    with pytest.raises(ValueError, match="not an output"):
        grad_graph(graph, ["x"], loss=graph.nodes[0].outputs[0])
    b = GraphBuilder("vector", "float64")
    b.output(b.exp(b.input("x", (2,))))
    with pytest.raises(ValueError, match="one-element"):
        grad_graph(b.build(), ["x"], loss=b.outputs[0])
    with pytest.raises(ValueError, match="no value"):
        grad_graph(graph, ["nope"])
    b = GraphBuilder("ints", "float64")
    b.output(b.add(b.input("i", (2,), "int64"), b.input("j", (2,), "int64")))
    with pytest.raises(ValueError, match="not a float"):
        grad_graph(b.build(), ["i"])


def test_grad_graph_names_an_op_without_a_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(VJP_RULES, "Tanh")
    b = GraphBuilder("norule", "float64")
    b.output(b.tanh(b.input("x", (2,))))
    with pytest.raises(NotImplementedError, match="no VJP rule for op Tanh"):
        grad_graph(b.build(), ["x"])


def test_backward_nodes_never_reuse_a_forward_node_name() -> None:
    graph = _mlp()
    backward = grad_graph(graph, ["x", "w"], loss=graph.outputs[0])
    names = [n.name for n in backward.nodes]
    assert len(names) == len(set(names))
    assert {n.name for n in graph.nodes} <= set(names)


def test_subgradients_at_the_kinks_follow_the_documented_conventions() -> None:
    b = GraphBuilder("kinks", "float64")
    x, y = b.input("x", (3,)), b.input("y", (3,))
    b.output(
        b.relu(x),
        b.op("Abs", x),
        b.maximum(x, y),
        b.op("Clip", x, min=0.0, max=1.0),
        b.op("LeakyRelu", x, alpha=0.1),
    )
    graph = b.build()
    outs = list(graph.outputs)
    for i, want_x, want_y in (
        (0, 0.0, None),
        (1, 0.0, None),
        (2, 0.5, 0.5),
        (3, 1.0, None),
        (4, 1.0, None),
    ):
        backward = grad_graph(graph, ["x", "y"], keep_outputs=False)
        feed = {"x": np.zeros(3), "y": np.zeros(3)}
        feed |= {cotangent_name(o): np.full(3, 1.0 if k == i else 0.0) for k, o in enumerate(outs)}
        got = run_graph(backward, feed)
        np.testing.assert_array_equal(got[gradient_name("x")], np.full(3, want_x), err_msg=outs[i])
        np.testing.assert_array_equal(
            got[gradient_name("y")], np.full(3, want_y or 0.0), err_msg=outs[i]
        )


def _transformer_block(b: GraphBuilder) -> Tensor:
    rng = np.random.default_rng(0)
    x = b.input("x", (8, 16))
    w1 = b.const(rng.standard_normal((16, 32)) * 0.2, name="w1")
    w2 = b.const(rng.standard_normal((32, 16)) * 0.2, name="w2")
    gamma, beta = b.const(np.ones(16), name="gamma"), b.const(np.zeros(16), name="beta")
    h = b.gelu(b.matmul(b.layer_norm(x, gamma, beta), w1))
    return b.softmax(b.add(b.matmul(h, w2), x))


COMPILED: dict[str, tuple[Callable[[GraphBuilder], Tensor], tuple[str, ...]]] = {
    "transformer-block": (_transformer_block, ("x", "w1", "w2", "gamma", "beta")),
    "conv-grouped": (
        lambda b: b.op(
            "Conv",
            b.input("x", (1, 2, 6, 5)),
            b.input("w", (4, 1, 3, 3)),
            strides=(2, 1),
            pads=(1, 1, 1, 1),
            group=2,
        ),
        ("x", "w"),
    ),
    "pools": (
        lambda b: b.op(
            "AveragePool",
            b.op(
                "MaxPool",
                b.input("x", (1, 2, 7, 6)),
                kernel_shape=(3, 3),
                strides=(2, 2),
                pads=(1, 1, 1, 1),
            ),
            kernel_shape=(2, 2),
            pads=(1, 0, 0, 1),
        ),
        ("x",),
    ),
    "attention": (
        lambda b: b.op(
            "Attention",
            b.input("q", (2, 4, 8)),
            b.input("k", (2, 6, 8)),
            b.input("v", (2, 6, 8)),
            scale=0.3,
        ),
        ("q", "k", "v"),
    ),
    "scatter-gather": (
        lambda b: b.op(
            "ScatterND",
            b.input("d", (5, 4)),
            b.const(np.array([[1], [3], [1]]), dtype="int64"),
            b.op("Gather", b.input("u", (2, 4)), b.const(np.array([0, 1, 1]), dtype="int64")),
        ),
        ("d", "u"),
    ),
}


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_backward_graph_compiles_through_the_fusion_pipeline(name: str) -> None:
    # the backward is a graph like any other: fused by the default passes, compiled, run
    from fusiontune.config import FusionConfig
    from fusiontune.passes.pipeline import run_pipeline
    from fusiontune.runtime import build_program

    build, wrt = COMPILED[name]
    b = GraphBuilder(name, "float32")
    out = build(b)
    b.output(b.reduce_mean(b.mul(out, out), tuple(range(len(out.shape))), keepdims=False))
    graph = b.build()
    backward = grad_graph(graph, wrt, loss=graph.outputs[0])
    fused = run_pipeline(backward, FusionConfig.defaults()).fused
    assert len(fused.groups) < len(backward.nodes)
    feed = random_inputs(backward, seed=1)
    got = build_program(fused).run(feed)
    want = run_graph(backward, feed)
    for value in backward.outputs:
        scale = float(np.max(np.abs(want[value])))
        np.testing.assert_allclose(
            got[value], want[value], rtol=1e-4, atol=1e-5 * scale, err_msg=value
        )


# ---- random graphs --------------------------------------------------------------------------------
MAIN = (2, 3)
"""Every tensor of a random graph is (2, 3) or a (3,) vector, so that any two combine."""


def _value(b: GraphBuilder, t: Tensor, feed: Mapping[str, np.ndarray]) -> np.ndarray:
    g = Graph("probe", b.values, tuple(b.nodes), tuple(b.inputs), (t.name,), b.constants)
    return run_graph(g, feed)[t.name]


def _nudge(
    b: GraphBuilder, t: Tensor, feed: Mapping[str, np.ndarray], kinks: Sequence[float]
) -> Tensor:
    """``t`` plus a constant that moves each of its elements at least 0.1 away from ``kinks``."""
    v = _value(b, t, feed)
    moved = away(v, 0.1)
    if np.array_equal(moved, v):
        return t
    return b.add(t, b.const(moved - v))


Step = Callable[[GraphBuilder, Tensor, Tensor, Tensor, Mapping[str, np.ndarray]], Tensor]


def _unary_step(op: str, **attrs: object) -> Step:
    return lambda b, x, y, v, f: b.op(op, x, **attrs)


def _kinked(op: str, **attrs: object) -> Step:
    return lambda b, x, y, v, f: b.op(op, _nudge(b, x, f, KINKS), **attrs)


def _max_pool(
    b: GraphBuilder, x: Tensor, y: Tensor, v: Tensor, f: Mapping[str, np.ndarray]
) -> Tensor:
    row = b.reshape(x, (1, 2, 3))
    vals = _value(b, row, f)
    assume(np.min(np.abs(np.diff(vals, axis=-1))) > 1e-3)  # no near-tie inside a window
    return b.reshape(b.op("MaxPool", row, kernel_shape=(2,), pads=(0, 1)), MAIN)


def _maximum(
    b: GraphBuilder, x: Tensor, y: Tensor, v: Tensor, f: Mapping[str, np.ndarray]
) -> Tensor:
    gap = _value(b, x, f) - _value(b, y, f)
    shift = np.where(np.abs(gap) < 0.1, 0.3 * np.where(gap >= 0, 1.0, -1.0), 0.0)
    return b.maximum(b.add(x, b.const(shift)) if shift.any() else x, y)


def _reduce_max(
    b: GraphBuilder, x: Tensor, y: Tensor, v: Tensor, f: Mapping[str, np.ndarray]
) -> Tensor:
    vals = np.sort(_value(b, x, f), axis=-1)
    gap = vals[..., -1] - vals[..., -2]
    assume(np.all((gap == 0) | (gap > 1e-3)))  # exact ties (copies of one value) are fine
    return b.add(y, b.reduce_max(x, -1))


STEPS: dict[str, Step] = {
    "Exp(tanh)": lambda b, x, y, v, f: b.exp(b.tanh(x)),
    "Log(x^2+1)": lambda b, x, y, v, f: b.log(b.add(b.mul(x, x), 1.0)),
    "Sqrt(x^2+1)": lambda b, x, y, v, f: b.sqrt(b.add(b.mul(x, x), 1.0)),
    "Sigmoid": _unary_step("Sigmoid"),
    "Tanh": _unary_step("Tanh"),
    "Sin": _unary_step("Sin"),
    "Gelu": _unary_step("Gelu"),
    "Gelu-tanh": _unary_step("Gelu", approximate="tanh"),
    "Silu": _unary_step("Silu"),
    "Softplus": _unary_step("Softplus"),
    "Erf": _unary_step("Erf"),
    "Relu": _kinked("Relu"),
    "Abs": _kinked("Abs"),
    "LeakyRelu": _kinked("LeakyRelu", alpha=0.2),
    "Clip": _kinked("Clip", min=-1.0, max=1.0),
    "HardSwish": _kinked("HardSwish"),
    "Add": lambda b, x, y, v, f: b.add(x, y),
    "Sub-vector": lambda b, x, y, v, f: b.sub(x, v),
    "Mul": lambda b, x, y, v, f: b.mul(x, y),
    "Mul-vector": lambda b, x, y, v, f: b.mul(v, x),
    "Div": lambda b, x, y, v, f: b.div(x, b.add(b.mul(y, y), 1.0)),
    "Maximum": _maximum,
    "SwiGlu": lambda b, x, y, v, f: b.swiglu(x, y),
    "ReduceSum": lambda b, x, y, v, f: b.add(x, b.reduce_sum(y, 0)),
    "ReduceMean": lambda b, x, y, v, f: b.mul(x, b.reduce_mean(y, -1)),
    "ReduceMax": _reduce_max,
    "Softmax": lambda b, x, y, v, f: b.softmax(x),
    "LogSoftmax-axis0": lambda b, x, y, v, f: b.op("LogSoftmax", x, axis=0),
    "LayerNorm": lambda b, x, y, v, f: b.layer_norm(x, v, b.mul(v, 0.5)),
    "RMSNorm": lambda b, x, y, v, f: b.rms_norm(x, v),
    "MatMul": lambda b, x, y, v, f: b.matmul(x, b.matmul(b.transpose(y, (1, 0)), x)),
    "Attention": lambda b, x, y, v, f: b.op("Attention", x, y, b.mul(x, y), scale=0.6),
    "Transpose-Reshape": lambda b, x, y, v, f: b.reshape(b.transpose(x, (1, 0)), MAIN),
    "Concat-Slice": lambda b, x, y, v, f: b.slice(b.concat([x, y], 1), [1], [6], [1], [2]),
    "Split-Concat": lambda b, x, y, v, f: b.concat(list(reversed(b.split(x, (1, 2), 1))), 1),
    "Gather": lambda b, x, y, v, f: b.op(
        "Gather", x, b.const(np.array([2, 0, 2]), dtype="int64"), axis=1
    ),
    "Expand-vector": lambda b, x, y, v, f: b.mul(x, b.expand(v, MAIN)),
    "Pad-reflect": lambda b, x, y, v, f: b.slice(
        b.op("Pad", x, pads=(0, 2, 0, 0), mode="reflect"), [1], [4], [1]
    ),
    "Conv1d": lambda b, x, y, v, f: b.reshape(
        b.op(
            "Conv",
            b.reshape(x, (1, 2, 3)),
            b.const(np.linspace(-1, 1, 8).reshape(2, 2, 2)),
            pads=(1, 0),
        ),
        MAIN,
    ),
    "MaxPool1d": _max_pool,
    "AveragePool1d": lambda b, x, y, v, f: b.reshape(
        b.op("AveragePool", b.reshape(x, (1, 2, 3)), kernel_shape=(2,), pads=(1, 0)), MAIN
    ),
    "Where": lambda b, x, y, v, f: b.where(b.const(np.array([True, False, True])), x, y),
    "CumSum": lambda b, x, y, v, f: b.op("CumSum", x, axis=1, reverse=1),
}


@st.composite
def random_graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, np.ndarray]]:
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    b = GraphBuilder("random", "float64")
    pool = [b.input("x0", MAIN), b.input("x1", MAIN)]
    vec = b.input("v", (3,))
    feed = {
        "x0": rng.standard_normal(MAIN),
        "x1": rng.standard_normal(MAIN),
        "v": rng.uniform(0.5, 1.5, 3),
    }
    steps = draw(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4))
    for name in steps:
        x = pool[draw(st.integers(0, len(pool) - 1))]
        y = pool[draw(st.integers(0, len(pool) - 1))]
        out = STEPS[name](b, x, y, vec, feed)
        assert out.shape == MAIN, name
        pool.append(out)
    b.output(pool[-1], *([pool[-2]] if draw(st.booleans()) and len(pool) > 3 else []))
    return b.build(), feed


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(random_graphs())
def test_random_graph_gradients_match_finite_differences(
    case: tuple[Graph, dict[str, np.ndarray]],
) -> None:
    graph, feed = case
    check_gradients(graph, feed, rtol=1e-4, atol=1e-5)


def test_random_graph_steps_cover_the_priority_ops() -> None:
    b = GraphBuilder("probe", "float64")
    x, y, v = b.input("x0", MAIN), b.input("x1", MAIN), b.input("v", (3,))
    feed = {"x0": np.full(MAIN, 0.7), "x1": np.full(MAIN, -0.4), "v": np.ones(3)}
    for step in STEPS.values():
        if step is not _max_pool and step is not _reduce_max:
            step(b, x, y, v, feed)
    used = {n.op for n in b.nodes}
    for op in (
        "Softmax",
        "LayerNorm",
        "RMSNorm",
        "Gelu",
        "Attention",
        "Conv",
        "AveragePool",
        "MatMul",
        "Gather",
    ):
        assert op in used, op
