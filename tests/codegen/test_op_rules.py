"""Every op of the catalogue: a shape rule, a reference, a codegen rule, and a kernel that agrees.

The interpreter is the definition of each op (CONVENTIONS point 4). This file walks
``fusiontune.ir.ops.CATALOGUE``; :data:`CASES` holds small one-op graphs (broadcasting, several
axes, keepdims=False, every layout op, bool and float64 casts...) and each one, compiled as a single
kernel, must agree with the interpreter in the graph's own dtype (float32 tolerance) and with the
float64 interpreter (a looser tolerance: the float32 rounding of the op). Adding an op to the
catalogue without a case here fails :func:`test_every_catalogue_op_has_a_kernel_case`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from fusiontune.codegen.rules import rule_kind
from fusiontune.ir import CATALOGUE, Graph, GraphBuilder, Tensor, run_graph
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.runtime import build_program

F32_RTOL, F32_ATOL = 1e-5, 1e-6  # kernel vs the interpreter in the graph's own dtype
F64_RTOL, F64_ATOL = 1e-4, 1e-5  # kernel vs the float64 interpreter

Build = Callable[[GraphBuilder], "Tensor | tuple[Tensor, ...]"]


@dataclass(frozen=True)
class OpCase:
    """One small graph around one op.

    Attributes:
        op: the catalogue op under test (the graph may hold only this op).
        id: the pytest id.
        build: adds inputs, constants and the op to a builder; returns the outputs.
        domain: how inputs are drawn: ``normal``, ``positive`` (uniform in [0.5, 2]) or ``ints``
            (small integers, so that Equal and Cast-to-bool see ties and zeros).
        dtype: the graph's float dtype.
        rtol, atol: tolerance against the interpreter in the graph's own dtype.
        bug: a known library bug this case exposes; its kernel tests are strict xfails until the
            bug is fixed (then the xfail turns into a failure and the marker must go).
    """

    op: str
    id: str
    build: Build
    domain: str = "normal"
    dtype: str = "float32"
    rtol: float = F32_RTOL
    atol: float = F32_ATOL
    bug: str = ""


def _c(g: GraphBuilder, shape: tuple[int, ...], seed: int, positive: bool = False) -> Tensor:
    """A deterministic non-scalar constant (weights, gamma, bias)."""
    rng = np.random.default_rng(seed)
    arr = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    return g.const(arr.astype(g.dtype))


def _binary(op: str) -> list[OpCase]:
    """Same shapes, row / column / both-sided / rank-changing broadcasts, a scalar constant."""
    domain = "positive" if op in ("Div", "Pow") else "normal"
    f = getattr(GraphBuilder, {"Maximum": "maximum", "Minimum": "minimum"}.get(op, op.lower()))
    shapes = {
        "same": ((4, 5), (4, 5)),
        "row": ((4, 5), (5,)),
        "col": ((4, 5), (4, 1)),
        "outer": ((4, 1), (1, 5)),
        "rank3": ((2, 3, 5), (3, 1)),
        "lhs_small": ((1, 5), (3, 4, 5)),
        "rank0": ((4, 5), ()),
    }
    cases = [
        OpCase(
            op, f"{op}-{name}", lambda g, a=a, b=b: f(g, g.input("a", a), g.input("b", b)), domain
        )
        for name, (a, b) in shapes.items()
    ]
    scalar = 2.0 if op != "Pow" else 3.0
    cases.append(
        OpCase(op, f"{op}-scalar_const", lambda g: f(g, g.input("a", (4, 5)), scalar), domain)
    )
    cases.append(OpCase(op, f"{op}-const_lhs", lambda g: f(g, 0.5, g.input("a", (4, 5))), domain))
    return cases


def _unary(op: str, domain: str = "normal") -> list[OpCase]:
    f = getattr(GraphBuilder, op.lower())
    return [
        OpCase(op, f"{op}-2d", lambda g: f(g, g.input("x", (4, 7))), domain),
        OpCase(op, f"{op}-3d", lambda g: f(g, g.input("x", (2, 3, 33))), domain),
    ]


def _reduce(op: str) -> list[OpCase]:
    f = getattr(
        GraphBuilder,
        {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max"}[op],
    )
    axes_cases = [
        ((-1,), True),
        ((0,), True),
        ((1,), True),
        ((0, 2), True),
        ((1, 2), False),
        ((-1,), False),
        ((0,), False),
    ]
    cases = [
        OpCase(
            op,
            f"{op}-axes{'_'.join(map(str, axes))}-{'keep' if keep else 'drop'}",
            lambda g, axes=axes, keep=keep: f(g, g.input("x", (3, 5, 7)), axes, keepdims=keep),
        )
        for axes, keep in axes_cases
    ]
    cases.append(
        OpCase(
            op,
            f"{op}-all-keep",
            lambda g: g.op(op, g.input("x", (3, 5, 7)), axes=None, keepdims=True),
        )
    )
    cases.append(
        OpCase(
            op,
            f"{op}-all-drop",
            lambda g: g.op(op, g.input("x", (3, 5, 7)), axes=None, keepdims=False),
        )
    )
    return cases


def _norm_params(g: GraphBuilder, n: int, as_inputs: bool) -> tuple[Tensor, Tensor]:
    if as_inputs:
        return g.input("gamma", (n,)), g.input("beta", (n,))
    return _c(g, (n,), 1, positive=True), _c(g, (n,), 2)


CONV_RTOL, CONV_ATOL = 1e-4, 1e-5  # sums of up to 72 products, in another order than einsum's


def _conv(g: GraphBuilder, x: tuple[int, ...], w: tuple[int, ...], bias: bool, **attrs: object) -> Tensor:
    ins = [g.input("x", x), _c(g, w, 8)] + ([_c(g, (w[0],), 9)] if bias else [])
    return g.op("Conv", *ins, **attrs)


def _conv_cases() -> list[OpCase]:
    """Conv: groups, depthwise, stride 2, asymmetric pads, dilation, 1x1, bias or not, 1-D, float64."""
    grid = {
        "3x3_bias": ((2, 3, 7, 6), (4, 3, 3, 3), True, {"pads": (1, 1, 1, 1)}),
        "nobias_stride2": ((1, 4, 9, 8), (5, 4, 3, 3), False, {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
        "groups2_asym_pads": ((2, 4, 6, 7), (6, 2, 3, 2), True, {"group": 2, "pads": (0, 1, 2, 0)}),
        "depthwise": ((1, 6, 8, 8), (6, 1, 3, 3), True, {"group": 6, "pads": (1, 1, 1, 1)}),
        "depthwise_mult2_s2": ((1, 3, 9, 9), (6, 1, 3, 3), False, {"group": 3, "strides": (2, 2)}),
        "dilation2": ((1, 3, 9, 10), (4, 3, 3, 3), True, {"dilations": (2, 2), "pads": (2, 2, 2, 2)}),
        "1x1": ((2, 8, 5, 5), (4, 8, 1, 1), False, {}),
        "1x1_stride2": ((1, 8, 6, 6), (8, 8, 1, 1), True, {"strides": (2, 2)}),
        "1d": ((2, 3, 11), (4, 3, 3), True, {"pads": (1, 2)}),
        "1d_stride2_dilated": ((1, 4, 16), (2, 4, 3), False, {"strides": (2,), "dilations": (3,)}),
        "weight_1x1x1x1": ((1, 1, 4, 4), (1, 1, 1, 1), True, {}),
    }
    cases = [
        OpCase("Conv", f"Conv-{name}", lambda g, x=x, w=w, b=b, a=a: _conv(g, x, w, b, **a), rtol=CONV_RTOL, atol=CONV_ATOL)
        for name, (x, w, b, a) in grid.items()
    ]
    cases.append(OpCase(
        "Conv", "Conv-float64", lambda g: _conv(g, (1, 3, 6, 6), (4, 3, 3, 3), True, pads=(1, 1, 1, 1)),
        dtype="float64", rtol=1e-12, atol=1e-13,
    ))
    return cases


def _pool_cases() -> list[OpCase]:
    """MaxPool (pads, strides, dilations, ceil_mode, 1-D) and AveragePool (count_include_pad both ways, ceil_mode)."""
    mp = {
        "3x3_s2_pad1": ((1, 3, 9, 9), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
        "2x2": ((2, 2, 6, 8), {"kernel_shape": (2, 2), "strides": (2, 2)}),
        "ceil_asym": ((1, 2, 7, 8), {"kernel_shape": (3, 2), "strides": (2, 2), "pads": (0, 1, 1, 0), "ceil_mode": 1}),
        "dilated": ((1, 2, 9, 9), {"kernel_shape": (2, 3), "dilations": (2, 2), "pads": (1, 1, 1, 1)}),
        "1d": ((2, 3, 10), {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1)}),
        # rows of 52 padded columns: the row-by-row kernel (pool.POOL_FLAT_MAX_WIDTH), ceil_mode overhang
        "wide_rows": ((1, 2, 6, 50), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 0, 1), "ceil_mode": 1}),
        # no pads but an odd width: the scratch plane is one column wider than the input
        "odd_width_s2": ((2, 3, 7, 7), {"kernel_shape": (3, 3), "strides": (2, 2)}),
        "stride3": ((1, 2, 10, 11), {"kernel_shape": (2, 3), "strides": (3, 3), "ceil_mode": 1}),
    }
    ap = {
        "exclude_pad": ((1, 3, 7, 7), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
        "include_pad": ((1, 3, 7, 7), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": 1}),
        "ceil_include_pad": ((1, 2, 8, 7), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 0, 1, 0), "ceil_mode": 1, "count_include_pad": 1}),
        "ceil_exclude_pad": ((2, 2, 8, 7), {"kernel_shape": (2, 3), "strides": (3, 2), "ceil_mode": 1}),
        "global_1d": ((2, 4, 9), {"kernel_shape": (9,)}),
        # in place over planes of 961 (chunks of two, then one) and of 2304 (one a chunk)
        "chunks": ((2, 5, 31, 31), {"kernel_shape": (3, 3), "strides": (2, 2)}),
        "big_planes": ((1, 3, 48, 48), {"kernel_shape": (2, 2), "strides": (2, 2)}),
    }
    return [
        OpCase(op, f"{op}-{name}", lambda g, op=op, x=x, a=a: g.op(op, g.input("x", x), **a))
        for op, table in (("MaxPool", mp), ("AveragePool", ap))
        for name, (x, a) in table.items()
    ]


def _attention_cases() -> list[OpCase]:
    """Attention: no mask, a causal (Sq, Sk) constant, a (B, 1, 1, Sk) padding mask input, Dv != D,
    Sk not a multiple of kv_block, kv_block 0, float64. Online softmax sums in another order."""
    causal = np.triu(np.full((6, 9), -1e9), k=4)

    def att(g: GraphBuilder, q: tuple[int, ...], kv: tuple[int, ...], dv: int, mask: str, **attrs: object) -> Tensor:
        ins = [g.input("q", q), g.input("k", kv), g.input("v", (*kv[:-1], dv))]
        if mask == "causal":
            ins.append(g.const(causal.astype(g.dtype)))
        elif mask == "padding":
            ins.append(g.input("mask", (q[0], 1, 1, kv[-2])))
        return g.op("Attention", *ins, **attrs)

    grid = {
        "nomask_whole": ((2, 3, 6, 8), (2, 3, 9, 8), 8, "", {"scale": 0.35}),
        "causal_kv4": ((2, 3, 6, 8), (2, 3, 9, 8), 8, "causal", {"scale": 0.35, "kv_block": 4}),
        "padding_dv5_kv2": ((2, 2, 5, 4), (2, 2, 7, 4), 5, "padding", {"scale": 0.5, "kv_block": 2}),
        "bcast_kv_3d": ((3, 6, 8), (1, 9, 8), 8, "", {"kv_block": 8}),
    }
    cases = [
        OpCase("Attention", f"Attention-{name}", lambda g, q=q, kv=kv, dv=dv, m=m, a=a: att(g, q, kv, dv, m, **a), rtol=ATT_RTOL, atol=ATT_ATOL)
        for name, (q, kv, dv, m, a) in grid.items()
    ]
    cases.append(OpCase(
        "Attention", "Attention-float64_causal",
        lambda g: att(g, (1, 2, 6, 8), (1, 2, 9, 8), 8, "causal", scale=0.35, kv_block=3),
        dtype="float64", rtol=1e-12, atol=1e-13,
    ))
    return cases


ATT_RTOL, ATT_ATOL = 2e-5, 2e-6  # an online softmax: sums and rescalings in another order
NORM_RTOL, NORM_ATOL = 2e-5, 1e-5  # the expansion divides by a rsqrt; the reference by a sqrt

CASES: tuple[OpCase, ...] = (
    # ---- elementwise, binary -------------------------------------------------------------------
    *_binary("Add"),
    *_binary("Sub"),
    *_binary("Mul"),
    *_binary("Div"),
    *_binary("Maximum"),
    *_binary("Minimum"),
    *_binary("Pow"),
    OpCase("Pow", "Pow-square", lambda g: g.pow(g.input("a", (4, 5)), 2.0)),
    OpCase("Pow", "Pow-sqrt", lambda g: g.pow(g.input("a", (4, 5)), 0.5), "positive"),
    OpCase(
        "Greater", "Greater-same", lambda g: g.greater(g.input("a", (4, 5)), g.input("b", (4, 5)))
    ),
    OpCase("Greater", "Greater-row", lambda g: g.greater(g.input("a", (4, 5)), g.input("b", (5,)))),
    OpCase("Greater", "Greater-scalar", lambda g: g.greater(g.input("a", (4, 5)), 0.5)),
    OpCase("Less", "Less-col", lambda g: g.less(g.input("a", (4, 5)), g.input("b", (4, 1)))),
    OpCase("Less", "Less-scalar", lambda g: g.less(g.input("a", (4, 5)), -0.5)),
    OpCase(
        "Equal",
        "Equal-outer",
        lambda g: g.equal(g.input("a", (4, 1)), g.input("b", (1, 5))),
        "ints",
    ),
    OpCase("Equal", "Equal-scalar", lambda g: g.equal(g.input("a", (4, 5)), 1.0), "ints"),
    OpCase(
        "BiasAdd", "BiasAdd-input", lambda g: g.bias_add(g.input("x", (4, 6)), g.input("b", (6,)))
    ),
    OpCase(
        "BiasAdd", "BiasAdd-const3d", lambda g: g.bias_add(g.input("x", (2, 3, 6)), _c(g, (6,), 3))
    ),
    OpCase(
        "SwiGlu", "SwiGlu-same", lambda g: g.swiglu(g.input("gate", (4, 6)), g.input("up", (4, 6)))
    ),
    OpCase(
        "SwiGlu", "SwiGlu-bcast", lambda g: g.swiglu(g.input("gate", (4, 6)), g.input("up", (1, 6)))
    ),
    OpCase(
        "GeGlu", "GeGlu-erf", lambda g: g.op("GeGlu", g.input("gate", (4, 6)), g.input("up", (4, 6)))
    ),
    OpCase(
        "GeGlu",
        "GeGlu-tanh_bcast",
        lambda g: g.op("GeGlu", g.input("gate", (4, 6)), g.input("up", (1, 6)), approximate="tanh"),
    ),
    OpCase(
        "Add",
        "Add-float64",
        lambda g: g.add(g.input("a", (4, 5)), g.input("b", (5,))),
        dtype="float64",
        rtol=1e-12,
        atol=1e-14,
    ),
    OpCase(
        "Where",
        "Where-bool_input",
        lambda g: g.where(g.input("c", (4, 5), "bool"), g.input("a", (4, 5)), g.input("b", (4, 5))),
    ),
    OpCase(
        "Where",
        "Where-bcast",
        lambda g: g.where(g.input("c", (4, 1), "bool"), g.input("a", (1, 5)), g.input("b", (4, 5))),
    ),
    OpCase(
        "Where",
        "Where-scalar_branch",
        lambda g: g.where(g.input("c", (4, 5), "bool"), g.input("a", (4, 5)), -1e9),
    ),
    OpCase(
        "Where",
        "Where-const_cond",
        lambda g: g.where(
            g.const(np.eye(4, 5, dtype=bool)), g.input("a", (4, 5)), g.input("b", (5,))
        ),
    ),
    # ---- elementwise, unary ----------------------------------------------------------------------
    *_unary("Neg"),
    *_unary("Relu"),
    *_unary("Reciprocal", "positive"),
    *_unary("Sqrt", "positive"),
    *_unary("Rsqrt", "positive"),
    *_unary("Exp"),
    *_unary("Log", "positive"),
    *_unary("Tanh"),
    *_unary("Erf"),
    *_unary("Sigmoid"),
    *_unary("Silu"),
    *_unary("Gelu"),
    OpCase("Gelu", "Gelu-tanh", lambda g: g.gelu(g.input("x", (4, 7)), approximate="tanh")),
    OpCase("Clip", "Clip-relu6", lambda g: g.op("Clip", g.input("x", (4, 7)), min=0.0, max=6.0)),
    OpCase("Clip", "Clip-upper_only", lambda g: g.op("Clip", g.input("x", (2, 3, 33)), max=0.25)),
    OpCase("LeakyRelu", "LeakyRelu-2d", lambda g: g.op("LeakyRelu", g.input("x", (4, 7)), alpha=0.1)),
    OpCase("HardSigmoid", "HardSigmoid-2d", lambda g: g.op("HardSigmoid", g.input("x", (4, 7)), alpha=0.3, beta=0.4)),
    OpCase("HardSwish", "HardSwish-3d", lambda g: g.op("HardSwish", g.input("x", (2, 3, 33)))),
    OpCase(
        "BatchNorm",
        "BatchNorm-nchw",
        lambda g: g.op(
            "BatchNorm", g.input("x", (2, 3, 4, 5)), _c(g, (3, 1, 1), 1, positive=True), _c(g, (3, 1, 1), 2),
            _c(g, (3, 1, 1), 3), _c(g, (3, 1, 1), 4, positive=True), eps=1e-3,
        ),
    ),
    OpCase(
        "BatchNorm",
        "BatchNorm-nc",
        lambda g: g.op("BatchNorm", g.input("x", (4, 3)), *(g.input(p, (3,)) for p in ("s", "b", "m", "v"))),
        "positive",
    ),
    OpCase("Cast", "Cast-to_float64", lambda g: g.cast(g.input("x", (4, 5)), "float64")),
    OpCase("Cast", "Cast-to_bool", lambda g: g.cast(g.input("x", (4, 5)), "bool"), "ints"),
    OpCase(
        "Cast", "Cast-bool_to_float32", lambda g: g.cast(g.input("c", (4, 5), "bool"), "float32")
    ),
    OpCase(
        "Cast",
        "Cast-float64_to_float32",
        lambda g: g.cast(g.input("x", (4, 5)), "float32"),
        dtype="float64",
    ),
    OpCase(
        "Neg",
        "Neg-rank0",
        lambda g: g.neg(g.input("x", ())),
    ),
    OpCase(
        "Add",
        "Add-rank0_both",
        lambda g: g.add(g.input("a", ()), g.input("b", ())),
    ),
    OpCase("Cast", "Cast-to_int32", lambda g: g.cast(g.input("x", (4, 5)), "int32"), "ints"),
    # ---- reductions ------------------------------------------------------------------------------
    *_reduce("ReduceSum"),
    *_reduce("ReduceMean"),
    *_reduce("ReduceMax"),
    OpCase("Softmax", "Softmax-last", lambda g: g.softmax(g.input("x", (4, 9)))),
    OpCase("Softmax", "Softmax-axis0", lambda g: g.softmax(g.input("x", (4, 9)), axis=0)),
    OpCase("Softmax", "Softmax-axis1_of_3", lambda g: g.softmax(g.input("x", (2, 5, 3)), axis=1)),
    OpCase("Softmax", "Softmax-3d_last", lambda g: g.softmax(g.input("x", (2, 3, 16)), axis=-1)),
    OpCase(
        "LayerNorm",
        "LayerNorm-const_params",
        lambda g: g.layer_norm(g.input("x", (4, 16)), *_norm_params(g, 16, False)),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "LayerNorm",
        "LayerNorm-input_params_3d",
        lambda g: g.layer_norm(g.input("x", (2, 3, 8)), *_norm_params(g, 8, True), eps=1e-3),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "RMSNorm",
        "RMSNorm-const",
        lambda g: g.rms_norm(g.input("x", (4, 16)), _c(g, (16,), 1, True)),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "RMSNorm",
        "RMSNorm-input_3d",
        lambda g: g.rms_norm(g.input("x", (2, 3, 8)), g.input("gamma", (8,))),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "AddLayerNorm",
        "AddLayerNorm-same",
        lambda g: g.op(
            "AddLayerNorm",
            g.input("a", (4, 16)),
            g.input("b", (4, 16)),
            *_norm_params(g, 16, False),
            n_outputs=2,
        ),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "AddLayerNorm",
        "AddLayerNorm-bcast_residual",
        lambda g: g.op(
            "AddLayerNorm",
            g.input("a", (2, 3, 8)),
            g.input("b", (3, 8)),
            *_norm_params(g, 8, True),
            n_outputs=2,
        ),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "AddRmsNorm",
        "AddRmsNorm-same",
        lambda g: g.op(
            "AddRmsNorm",
            g.input("a", (4, 16)),
            g.input("b", (4, 16)),
            _c(g, (16,), 1, True),
            n_outputs=2,
        ),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    OpCase(
        "AddRmsNorm",
        "AddRmsNorm-bcast_residual",
        lambda g: g.op(
            "AddRmsNorm",
            g.input("a", (2, 3, 8)),
            g.input("b", (1, 8)),
            g.input("gamma", (8,)),
            n_outputs=2,
        ),
        rtol=NORM_RTOL,
        atol=NORM_ATOL,
    ),
    # ---- contraction -----------------------------------------------------------------------------
    OpCase("MatMul", "MatMul-2d", lambda g: g.matmul(g.input("a", (5, 7)), g.input("b", (7, 3)))),
    OpCase(
        "MatMul", "MatMul-const_weight", lambda g: g.matmul(g.input("a", (5, 7)), _c(g, (7, 3), 4))
    ),
    OpCase(
        "MatMul",
        "MatMul-bias_vector",
        lambda g: g.matmul(g.input("a", (5, 7)), _c(g, (7, 3), 4), _c(g, (3,), 5)),
    ),
    OpCase(
        "MatMul",
        "MatMul-bias_matrix",
        lambda g: g.matmul(g.input("a", (5, 7)), g.input("b", (7, 3)), g.input("bias", (5, 3))),
    ),
    OpCase(
        "MatMul",
        "MatMul-batched",
        lambda g: g.matmul(g.input("a", (2, 5, 7)), g.input("b", (2, 7, 3))),
    ),
    OpCase(
        "MatMul",
        "MatMul-batched_bias",
        lambda g: g.matmul(
            g.input("a", (2, 5, 7)), g.input("b", (2, 7, 3)), g.input("bias", (2, 1, 3))
        ),
    ),
    OpCase(
        "MatMul",
        "MatMul-bcast_weight",
        lambda g: g.matmul(g.input("a", (2, 5, 7)), g.input("b", (7, 3))),
    ),
    OpCase(
        "MatMul",
        "MatMul-bcast_weight_bias",
        lambda g: g.matmul(g.input("a", (2, 5, 7)), _c(g, (7, 3), 4), _c(g, (3,), 5)),
    ),
    OpCase(
        "MatMul",
        "MatMul-bcast_lhs",
        lambda g: g.matmul(g.input("a", (1, 5, 7)), g.input("b", (3, 7, 4))),
    ),
    OpCase(
        "MatMul",
        "MatMul-batched_4d",
        lambda g: g.matmul(g.input("a", (2, 3, 4, 5)), g.input("b", (2, 3, 5, 6))),
    ),
    OpCase(
        "MatMul",
        "MatMul-bias_size1_const",  # Linear(hidden, 1): a regression head
        lambda g: g.matmul(
            g.input("a", (5, 4)), _c(g, (4, 1), 4), g.const(np.full((1,), 0.5, np.float32))
        ),
    ),
    OpCase(
        "MatMul",
        "MatMul-weight_1x1_const",
        lambda g: g.matmul(g.input("a", (5, 1)), g.const(np.full((1, 1), 2.0, np.float32))),
    ),
    OpCase(
        "MatMul",
        "MatMul-partial_batch_bcast",
        lambda g: g.matmul(g.input("a", (2, 1, 4, 5)), g.input("b", (1, 3, 5, 6))),
    ),
    OpCase(
        "MatMul",
        "MatMul-float64",
        lambda g: g.matmul(g.input("a", (5, 7)), g.input("b", (7, 3))),
        dtype="float64",
        rtol=1e-12,
        atol=1e-13,
    ),
    # ---- layout ----------------------------------------------------------------------------------
    OpCase("Reshape", "Reshape-flatten", lambda g: g.reshape(g.input("x", (3, 4, 5)), (12, 5))),
    OpCase(
        "Reshape", "Reshape-minus1_and_0", lambda g: g.reshape(g.input("x", (3, 4, 5)), (0, -1))
    ),
    OpCase("Transpose", "Transpose-2d", lambda g: g.transpose(g.input("x", (3, 5)), (1, 0))),
    OpCase(
        "Transpose", "Transpose-perm201", lambda g: g.transpose(g.input("x", (2, 3, 4)), (2, 0, 1))
    ),
    OpCase(
        "Transpose",
        "Transpose-default_reverses",
        lambda g: g.op("Transpose", g.input("x", (2, 3, 4))),
    ),
    OpCase(
        "Concat",
        "Concat-axis0",
        lambda g: g.concat([g.input("a", (2, 5)), g.input("b", (3, 5))], axis=0),
    ),
    OpCase(
        "Concat",
        "Concat-axis1_three",
        lambda g: g.concat(
            [g.input("a", (2, 1, 4)), g.input("b", (2, 3, 4)), g.input("c", (2, 2, 4))], axis=1
        ),
    ),
    OpCase(
        "Concat",
        "Concat-last_with_const",
        lambda g: g.concat([g.input("a", (3, 2)), _c(g, (3, 4), 6)], axis=-1),
    ),
    OpCase(
        "Split", "Split-axis1_three", lambda g: g.split(g.input("x", (2, 7, 3)), (2, 3, 2), axis=1)
    ),
    OpCase("Split", "Split-last", lambda g: g.split(g.input("x", (4, 6)), (1, 5), axis=-1)),
    OpCase(
        "Slice", "Slice-window", lambda g: g.slice(g.input("x", (6, 8)), (1, 2), (5, 7), (0, 1))
    ),
    OpCase(
        "Slice",
        "Slice-steps",
        lambda g: g.slice(g.input("x", (6, 8)), (0, 1), (6, 8), (0, 1), (2, 3)),
    ),
    OpCase(
        "Slice",
        "Slice-negative_step",
        lambda g: g.slice(g.input("x", (4, 8)), (-1,), (-100,), (1,), (-2,)),
    ),
    OpCase(
        "Slice",
        "Slice-clamped_end_3d",
        lambda g: g.slice(g.input("x", (2, 5, 4)), (1,), (1000,), (-2,)),
    ),
    OpCase("Expand", "Expand-rows", lambda g: g.expand(g.input("x", (1, 5)), (3, 5))),
    OpCase("Expand", "Expand-cols", lambda g: g.expand(g.input("x", (3, 1)), (3, 4))),
    OpCase("Expand", "Expand-rank", lambda g: g.expand(g.input("x", (5,)), (2, 3, 5))),
    # Gather: the "ints" domain draws indices in [-2, 3): negative ones count from the end.
    OpCase(
        "Gather",
        "Gather-rows_ints",
        lambda g: g.op("Gather", g.input("x", (6, 4), "float32"), g.input("i", (2, 3), "int64"), axis=0),
        "ints",
    ),
    OpCase(
        "Gather",
        "Gather-axis1_const_idx",
        lambda g: g.op("Gather", g.input("x", (2, 5, 3)), g.const(np.array([4, 0, -1, 2]), dtype="int64"), axis=1),
    ),
    OpCase(
        "Gather",
        "Gather-scalar_idx_last",
        lambda g: g.op("Gather", g.input("x", (3, 4)), g.const(np.array(-2), dtype="int64"), axis=-1),
    ),
    OpCase(
        "Gather",
        "Gather-embedding_from_const",
        lambda g: g.op("Gather", _c(g, (10, 8), 7), g.input("ids", (2, 5), "int64"), axis=0),
        "ints",
    ),
    # ---- conv and window ops (codegen/conv.py, codegen/pool.py) ----------------------------------
    *_conv_cases(),
    *_pool_cases(),
    # ---- attention (codegen/attention.py; the grid of shapes and blocks is test_attention.py) ----
    *_attention_cases(),
    # ---- rotary position embedding (codegen/rotary.py) --------------------------------------------
    OpCase(
        "RotaryPositionEmbedding",
        "RotaryPositionEmbedding-halves_broadcast_heads",
        lambda g: g.op(
            "RotaryPositionEmbedding", g.input("x", (2, 4, 6, 8)), _c(g, (2, 1, 6, 8), 11), _c(g, (2, 1, 6, 8), 12)
        ),
    ),
    OpCase(
        "RotaryPositionEmbedding",
        "RotaryPositionEmbedding-interleaved_float64",
        lambda g: g.op("RotaryPositionEmbedding", g.input("x", (3, 5, 16)), _c(g, (5, 16), 13), g.input("sin", (16,)), mode=1),
        dtype="float64",
    ),
    OpCase(
        "RotaryPositionEmbedding",
        "RotaryPositionEmbedding-large_parallel",
        lambda g: g.op("RotaryPositionEmbedding", g.input("x", (4, 8, 64, 64)), _c(g, (1, 1, 64, 64), 14), _c(g, (1, 1, 64, 64), 15)),
    ),
    # ---- logic, comparison and elementwise ops of real exports (ir/_ops_logic.py) ----------------
    OpCase(
        "And",
        "And-bool_row",
        lambda g: g.op("And", g.input("a", (4, 5), "bool"), g.input("b", (5,), "bool")),
    ),
    OpCase(
        "Or",
        "Or-bool_outer",
        lambda g: g.op("Or", g.input("a", (4, 1), "bool"), g.input("b", (1, 5), "bool")),
    ),
    OpCase(
        "Xor",
        "Xor-bool_const",
        lambda g: g.op(
            "Xor", g.input("a", (2, 3, 5), "bool"), g.const(np.array([[True], [False], [True]]))
        ),
    ),
    OpCase("Not", "Not-bool", lambda g: g.op("Not", g.input("a", (4, 7), "bool"))),
    OpCase("Not", "Not-bool_rank0", lambda g: g.op("Not", g.input("a", (), "bool"))),
    OpCase(
        "GreaterOrEqual",
        "GreaterOrEqual-ties_row",
        lambda g: g.op("GreaterOrEqual", g.input("a", (4, 5)), g.input("b", (5,))),
        "ints",
    ),
    OpCase(
        "GreaterOrEqual",
        "GreaterOrEqual-int64_scalar",
        lambda g: g.op(
            "GreaterOrEqual", g.input("a", (4, 5), "int64"), g.const(np.array(0), dtype="int64")
        ),
        "ints",
    ),
    OpCase(
        "LessOrEqual",
        "LessOrEqual-ties_col",
        lambda g: g.op("LessOrEqual", g.input("a", (4, 5)), g.input("b", (4, 1))),
        "ints",
    ),
    OpCase(
        "LessOrEqual",
        "LessOrEqual-bool",
        lambda g: g.op("LessOrEqual", g.input("a", (4, 5), "bool"), g.input("b", (4, 5), "bool")),
    ),
    OpCase(
        "LessOrEqual",
        "LessOrEqual-float64",
        lambda g: g.op("LessOrEqual", g.input("a", (4, 5)), g.input("b", (1, 5))),
        "ints",
        dtype="float64",
    ),
    OpCase(
        "Greater",
        "Greater-int64_outer",
        lambda g: g.greater(g.input("a", (4, 1), "int64"), g.input("b", (1, 5), "int64")),
        "ints",
    ),
    OpCase(
        "Less",
        "Less-int32_const",
        lambda g: g.less(
            g.input("a", (4, 5), "int32"), g.const(np.array([0, 1, -1, 2, -2]), dtype="int32")
        ),
        "ints",
    ),
    OpCase(
        "Equal",
        "Equal-bool",
        lambda g: g.equal(g.input("a", (4, 5), "bool"), g.input("b", (4, 1), "bool")),
    ),
    OpCase(
        "Equal",
        "Equal-int64_row",
        lambda g: g.equal(g.input("a", (4, 5), "int64"), g.input("b", (5,), "int64")),
        "ints",
    ),
    OpCase("IsNaN", "IsNaN-2d", lambda g: g.op("IsNaN", g.input("x", (4, 7)))),
    OpCase(
        "IsInf",
        "IsInf-3d_float64",
        lambda g: g.op("IsInf", g.input("x", (2, 3, 5))),
        dtype="float64",
    ),
    OpCase(
        "IsInf",
        "IsInf-positive_only",
        lambda g: g.op("IsInf", g.input("x", (4, 7)), detect_negative=0),
    ),
    OpCase(
        "IsInf",
        "IsInf-negative_only",
        lambda g: g.op("IsInf", g.input("x", (4, 7)), detect_positive=0),
    ),
    OpCase(
        "IsInf",
        "IsInf-neither",
        lambda g: g.op("IsInf", g.input("x", (4, 7)), detect_positive=0, detect_negative=0),
    ),
    OpCase(
        "Where",
        "Where-bool_branches",
        lambda g: g.where(
            g.input("c", (4, 1), "bool"), g.input("a", (5,), "bool"), g.input("b", (4, 5), "bool")
        ),
    ),
    OpCase(
        "Where",
        "Where-int64_three_way_bcast",
        lambda g: g.where(
            g.input("c", (2, 1, 5), "bool"),
            g.input("a", (3, 1), "int64"),
            g.input("b", (1,), "int64"),
        ),
        "ints",
    ),
    OpCase(
        "Where",
        "Where-float64_scalar_else",
        lambda g: g.where(g.input("c", (3, 1), "bool"), g.input("a", (1, 4)), g.input("b", ())),
        dtype="float64",
    ),
    OpCase("Cast", "Cast-bool_to_int64", lambda g: g.cast(g.input("c", (4, 5), "bool"), "int64")),
    OpCase(
        "Cast",
        "Cast-int64_to_bool",
        lambda g: g.cast(g.input("x", (4, 5), "int64"), "bool"),
        "ints",
    ),
    OpCase(
        "Cast",
        "Cast-int64_to_float32",
        lambda g: g.cast(g.input("x", (4, 5), "int64"), "float32"),
        "ints",
    ),
    OpCase(
        "Cast",
        "Cast-float64_to_bool",
        lambda g: g.cast(g.input("x", (4, 5)), "bool"),
        "ints",
        dtype="float64",
    ),
    OpCase(
        "Cast",
        "Cast-bool_to_float64",
        lambda g: g.cast(g.input("c", (4, 5), "bool"), "float64"),
        dtype="float64",
    ),
    OpCase("Abs", "Abs-2d", lambda g: g.op("Abs", g.input("x", (4, 7)))),
    OpCase("Abs", "Abs-3d", lambda g: g.op("Abs", g.input("x", (2, 3, 33)))),
    OpCase("Abs", "Abs-int64", lambda g: g.op("Abs", g.input("x", (4, 5), "int64")), "ints"),
    OpCase("Sign", "Sign-zeros", lambda g: g.op("Sign", g.input("x", (4, 7))), "ints"),
    OpCase("Sign", "Sign-int64", lambda g: g.op("Sign", g.input("x", (4, 5), "int64")), "ints"),
    OpCase("Cos", "Cos-2d", lambda g: g.op("Cos", g.input("x", (4, 7)))),
    OpCase("Cos", "Cos-3d", lambda g: g.op("Cos", g.input("x", (2, 3, 33)))),
    OpCase("Sin", "Sin-2d", lambda g: g.op("Sin", g.input("x", (4, 7)))),
    OpCase("Sin", "Sin-3d", lambda g: g.op("Sin", g.input("x", (2, 3, 33)))),
    OpCase(
        "Sin",
        "Sin-float64",
        lambda g: g.op("Sin", g.input("x", (4, 7))),
        dtype="float64",
        rtol=1e-12,
        atol=1e-14,
    ),
    OpCase(
        "Mod",
        "Mod-int64_floor",
        lambda g: g.op("Mod", g.input("a", (4, 5), "int64"), g.input("b", (5,), "int64")),
        "ints",
    ),
    OpCase(
        "Mod",
        "Mod-int64_fmod",
        lambda g: g.op("Mod", g.input("a", (4, 5), "int64"), g.input("b", (4, 1), "int64"), fmod=1),
        "ints",
    ),
    OpCase(
        "Mod",
        "Mod-int32_fmod_const",
        lambda g: g.op(
            "Mod", g.input("a", (4, 5), "int32"), g.const(np.array(-3), dtype="int32"), fmod=1
        ),
        "ints",
    ),
    OpCase(
        "Mod",
        "Mod-float_fmod_row",
        lambda g: g.op("Mod", g.input("a", (4, 5)), g.input("b", (5,)), fmod=1),
    ),
    OpCase(
        "Mod",
        "Mod-float_floor_outer",
        lambda g: g.op("Mod", g.input("a", (4, 1)), g.input("b", (1, 5))),
    ),
    OpCase(
        "Mod",
        "Mod-float64_fmod",
        lambda g: g.op("Mod", g.input("a", (4, 5)), g.input("b", (4, 5)), fmod=1),
        dtype="float64",
        rtol=1e-12,
        atol=1e-14,
    ),
    OpCase("Softplus", "Softplus-2d", lambda g: g.op("Softplus", g.input("x", (4, 7)))),
    OpCase("Softplus", "Softplus-3d", lambda g: g.op("Softplus", g.input("x", (2, 3, 33)))),
    OpCase("Elu", "Elu-alpha", lambda g: g.op("Elu", g.input("x", (4, 7)), alpha=0.5)),
    OpCase("Elu", "Elu-3d_default", lambda g: g.op("Elu", g.input("x", (2, 3, 33)))),
    OpCase("Selu", "Selu-default", lambda g: g.op("Selu", g.input("x", (4, 7)))),
    OpCase(
        "Selu",
        "Selu-float64_attrs",
        lambda g: g.op("Selu", g.input("x", (2, 3, 5)), alpha=1.5, gamma=2.0),
        dtype="float64",
        rtol=1e-12,
        atol=1e-14,
    ),
    OpCase(
        "PRelu",
        "PRelu-nchw_channel_slope",
        lambda g: g.op("PRelu", g.input("x", (2, 3, 4, 5)), _c(g, (3, 1, 1), 10)),
    ),
    OpCase(
        "PRelu",
        "PRelu-one_slope",
        lambda g: g.op("PRelu", g.input("x", (4, 7)), g.const(np.array([0.25]))),
    ),
    OpCase(
        "PRelu",
        "PRelu-slope_input_row",
        lambda g: g.op("PRelu", g.input("x", (2, 3, 6)), g.input("s", (6,))),
    ),
    OpCase(
        "PRelu",
        "PRelu-float64",
        lambda g: g.op("PRelu", g.input("x", (2, 3, 4)), g.input("s", (3, 1))),
        dtype="float64",
        rtol=1e-12,
        atol=1e-14,
    ),
    OpCase("LogSoftmax", "LogSoftmax-last", lambda g: g.op("LogSoftmax", g.input("x", (4, 9)))),
    OpCase(
        "LogSoftmax", "LogSoftmax-axis0", lambda g: g.op("LogSoftmax", g.input("x", (4, 9)), axis=0)
    ),
    OpCase(
        "LogSoftmax",
        "LogSoftmax-axis1_of_3",
        lambda g: g.op("LogSoftmax", g.input("x", (2, 5, 3)), axis=1),
    ),
    OpCase(
        "LogSoftmax",
        "LogSoftmax-3d_last",
        lambda g: g.op("LogSoftmax", g.input("x", (2, 3, 16)), axis=-1),
    ),
    OpCase(
        "LogSoftmax",
        "LogSoftmax-float64",
        lambda g: g.op("LogSoftmax", g.input("x", (3, 40))),
        dtype="float64",
        rtol=1e-12,
        atol=1e-13,
    ),
    # ---- index, layout and window ops of real exports (ir/_ops_index.py) -------------------------
    # Live indices come from "ints" inputs, drawn in [-2, 3): negative ones count from the end.
    OpCase(
        "GatherND", "GatherND-pairs_ints",
        lambda g: g.op("GatherND", g.input("x", (4, 3, 5)), g.input("i", (2, 3, 2), "int64")), "ints",
    ),
    OpCase(
        "GatherND", "GatherND-batch1_const",
        lambda g: g.op(
            "GatherND", g.input("x", (2, 4, 5)),
            g.const(np.array([[[1], [-1], [0]], [[3], [2], [-4]]]), dtype="int64"), batch_dims=1,
        ),
    ),
    OpCase(
        "GatherND", "GatherND-elements_int32",
        lambda g: g.op("GatherND", g.input("x", (3, 4)), g.const(np.array([[0, 1], [-1, -2], [2, 3]]), dtype="int32")),
    ),
    OpCase(
        "GatherElements", "GatherElements-axis1_ints",
        lambda g: g.op("GatherElements", g.input("x", (3, 4, 5)), g.input("i", (3, 2, 5), "int64"), axis=1), "ints",
    ),
    OpCase(
        "GatherElements", "GatherElements-last_smaller_const",
        lambda g: g.op(
            "GatherElements", g.input("x", (3, 6)),
            g.const(np.array([[5, -1, 0, 2], [-6, 3, 3, 1]]), dtype="int64"), axis=-1,
        ),
    ),
    OpCase(
        "ScatterND", "ScatterND-rows",
        lambda g: g.op(
            "ScatterND", g.input("x", (5, 4)), g.const(np.array([[1], [-1], [3]]), dtype="int64"), g.input("u", (3, 4)),
        ),
    ),
    OpCase(
        "ScatterND", "ScatterND-add_repeated",
        lambda g: g.op(
            "ScatterND", g.input("x", (4, 3, 2)), g.const(np.array([[0, 1], [2, -1], [0, 1]]), dtype="int64"),
            g.input("u", (3, 2)), reduction="add",
        ),
    ),
    OpCase(
        "ScatterND", "ScatterND-mul_live_ints",
        lambda g: g.op(
            "ScatterND", g.input("x", (4, 6)), g.input("i", (3, 1), "int64"), g.input("u", (3, 6)), reduction="mul",
        ),
        "ints",
    ),
    OpCase(
        "ScatterND", "ScatterND-max_elements",
        lambda g: g.op(
            "ScatterND", g.input("x", (3, 4)), g.const(np.array([[0, 0], [2, -1], [0, 0]]), dtype="int64"),
            g.input("u", (3,)), reduction="max",
        ),
    ),
    OpCase("CumSum", "CumSum-axis1", lambda g: g.op("CumSum", g.input("x", (3, 7, 5)), axis=1)),
    OpCase(
        "CumSum", "CumSum-exclusive_reverse_last",
        lambda g: g.op("CumSum", g.input("x", (4, 9)), axis=1, exclusive=1, reverse=1),
    ),
    OpCase("CumSum", "CumSum-int64", lambda g: g.op("CumSum", g.input("x", (6, 3), "int64"), axis=0), "ints"),
    OpCase(
        "CumSum", "CumSum-float64_exclusive",
        lambda g: g.op("CumSum", g.input("x", (5, 4)), axis=0, exclusive=1), dtype="float64", rtol=1e-12, atol=1e-13,
    ),
    OpCase("Trilu", "Trilu-upper_k1", lambda g: g.op("Trilu", g.input("x", (5, 7)), upper=1, k=1)),
    OpCase("Trilu", "Trilu-lower_kneg1_3d", lambda g: g.op("Trilu", g.input("x", (2, 6, 4)), upper=0, k=-1)),
    OpCase("Trilu", "Trilu-upper_k_past_end", lambda g: g.op("Trilu", g.input("x", (3, 4)), upper=1, k=-5)),
    OpCase("Tile", "Tile-2d", lambda g: g.op("Tile", g.input("x", (3, 4)), repeats=(2, 3))),
    OpCase("Tile", "Tile-3d_middle_once", lambda g: g.op("Tile", g.input("x", (2, 3, 5)), repeats=(3, 1, 2))),
    OpCase(
        "Pad", "Pad-constant_value",
        lambda g: g.op("Pad", g.input("x", (2, 3, 4)), pads=(0, 1, 2, 1, 0, 3), mode="constant", value=-1.5),
    ),
    OpCase("Pad", "Pad-reflect", lambda g: g.op("Pad", g.input("x", (2, 3, 5)), pads=(0, 2, 3, 0, 1, 4), mode="reflect")),
    OpCase("Pad", "Pad-edge", lambda g: g.op("Pad", g.input("x", (3, 4)), pads=(2, 0, 1, 5), mode="edge")),
    OpCase(
        "Pad", "Pad-wrap_with_crop",
        lambda g: g.op("Pad", g.input("x", (4, 6)), pads=(-1, 2, 1, -2), mode="wrap"),
    ),
    OpCase("Pad", "Pad-int64_1d", lambda g: g.op("Pad", g.input("x", (5,), "int64"), pads=(2, 1), value=7.0), "ints"),
    *[
        OpCase(
            "ConvTranspose", f"ConvTranspose-{name}",
            lambda g, x=x, w=w, b=b, a=a: g.op(
                "ConvTranspose", g.input("x", x), _c(g, w, 8), *([_c(g, (w[1] * a.get("group", 1),), 9)] if b else []), **a,
            ),
            rtol=CONV_RTOL, atol=CONV_ATOL,
        )
        for name, (x, w, b, a) in {
            "3x3_s2_bias": ((2, 3, 5, 4), (3, 4, 3, 3), True, {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
            "output_padding": ((1, 4, 4, 5), (4, 2, 4, 4), False, {"strides": (2, 2), "pads": (1, 1, 1, 1), "output_padding": (1, 0)}),
            "groups2_dilated_asym": ((2, 4, 5, 4), (4, 3, 3, 2), True, {"group": 2, "dilations": (2, 1), "pads": (0, 1, 2, 0)}),
            "depthwise_s2": ((1, 6, 6, 6), (6, 1, 3, 3), True, {"group": 6, "strides": (2, 2)}),
            "1d_s3": ((2, 3, 7), (3, 5, 4), True, {"strides": (3,), "pads": (1, 2)}),
            "weight_1x1x1x1": ((1, 1, 4, 4), (1, 1, 1, 1), True, {"strides": (2, 2)}),
        }.items()
    ],
    # The fused backward ops (ir/_ops_grad.py); saved statistics (mean, rstd) are inputs.
    OpCase("SoftmaxGrad", "SoftmaxGrad-last", lambda g: g.op("SoftmaxGrad", g.input("y", (6, 33)), g.input("dy", (6, 33)))),
    OpCase("SoftmaxGrad", "SoftmaxGrad-axis1", lambda g: g.op("SoftmaxGrad", g.input("y", (3, 7, 5)), g.input("dy", (3, 7, 5)), axis=1)),
    OpCase(
        "LayerNormGrad", "LayerNormGrad-recompute",
        lambda g: g.op("LayerNormGrad", g.input("x", (4, 5, 24)), _c(g, (24,), 3), g.input("dy", (4, 5, 24)), n_outputs=2),
    ),
    OpCase(
        "LayerNormGrad", "LayerNormGrad-one_pass",
        lambda g: g.op("LayerNormGrad", g.input("x", (6, 40)), _c(g, (40,), 3), g.input("dy", (6, 40)), n_outputs=2, variance="one_pass"),
    ),
    OpCase(
        "LayerNormGrad", "LayerNormGrad-saved_stats",
        lambda g: g.op(
            "LayerNormGrad", g.input("x", (6, 40)), _c(g, (40,), 3), g.input("dy", (6, 40)),
            _c(g, (6, 1), 4), _c(g, (6, 1), 5, positive=True), n_outputs=2,
        ),
    ),
    OpCase(
        "RmsNormGrad", "RmsNormGrad-recompute",
        lambda g: g.op("RmsNormGrad", g.input("x", (8, 24)), _c(g, (24,), 3), g.input("dy", (8, 24)), n_outputs=2),
    ),
    OpCase(
        "RmsNormGrad", "RmsNormGrad-saved_rstd",
        lambda g: g.op(
            "RmsNormGrad", g.input("x", (8, 24)), _c(g, (24,), 3), g.input("dy", (8, 24)),
            _c(g, (8, 1), 5, positive=True), n_outputs=2,
        ),
    ),
    OpCase("GeluGrad", "GeluGrad-erf", lambda g: g.op("GeluGrad", g.input("x", (5, 37)), g.input("dy", (5, 37)))),
    OpCase(
        "GeluGrad", "GeluGrad-erf_saved_cdf",
        lambda g: g.op("GeluGrad", g.input("x", (5, 37)), g.input("dy", (5, 37)), _c(g, (5, 37), 6, positive=True)),
    ),
    OpCase(
        "GeluGrad", "GeluGrad-tanh_saved_cdf",
        lambda g: g.op("GeluGrad", g.input("x", (5, 37)), g.input("dy", (5, 37)), _c(g, (5, 37), 6, positive=True), approximate="tanh"),
    ),
    OpCase("GeluGrad", "GeluGrad-tanh", lambda g: g.op("GeluGrad", g.input("x", (5, 37)), g.input("dy", (5, 37)), approximate="tanh")),
    OpCase("GeluCdf", "GeluCdf-erf", lambda g: g.op("GeluCdf", g.input("x", (5, 37)))),
    OpCase("GeluCdf", "GeluCdf-tanh", lambda g: g.op("GeluCdf", g.input("x", (5, 37)), approximate="tanh")),
    OpCase("ReluGrad", "ReluGrad", lambda g: g.op("ReluGrad", g.input("y", (5, 37)), g.input("dy", (5, 37)))),
    OpCase(
        "AttentionGrad", "AttentionGrad-heads",
        lambda g: g.op(
            "AttentionGrad", g.input("q", (2, 3, 9, 8)), g.input("k", (2, 3, 11, 8)), g.input("v", (2, 3, 11, 5)),
            g.input("dy", (2, 3, 9, 5)), n_outputs=3, scale=0.35,
        ),
    ),
    OpCase(
        "AttentionGrad", "AttentionGrad-broadcast_mask",
        lambda g: g.op(
            "AttentionGrad", g.input("q", (4, 7, 6)), g.input("k", (4, 10, 6)), g.input("v", (4, 10, 6)),
            g.input("dy", (4, 7, 6)), _c(g, (1, 10), 12), n_outputs=3, scale=0.4,
        ),
    ),
    OpCase(
        "AttentionGrad", "AttentionGrad-float64_causal",
        lambda g: g.op(
            "AttentionGrad", g.input("q", (2, 6, 4)), g.input("k", (2, 6, 4)), g.input("v", (2, 6, 3)),
            g.input("dy", (2, 6, 3)), g.const(np.triu(np.full((6, 6), -1e9), 1)), n_outputs=3,
        ),
        dtype="float64", rtol=1e-12, atol=1e-13,
    ),
    # Forward normalizations that save their statistics for the backward (save_stats=1).
    OpCase(
        "LayerNorm", "LayerNorm-save_stats",
        lambda g: g.op("LayerNorm", g.input("x", (4, 5, 24)), _c(g, (24,), 3), _c(g, (24,), 4), n_outputs=3, save_stats=1),
    ),
    OpCase(
        "AddLayerNorm", "AddLayerNorm-save_stats_one_pass",
        lambda g: g.op(
            "AddLayerNorm", g.input("a", (6, 40)), g.input("b", (6, 40)), _c(g, (40,), 3), _c(g, (40,), 4),
            n_outputs=4, save_stats=1, variance="one_pass",
        ),
    ),
    OpCase(
        "AddRmsNorm", "AddRmsNorm-save_stats",
        lambda g: g.op("AddRmsNorm", g.input("a", (6, 40)), g.input("b", (6, 40)), _c(g, (40,), 3), n_outputs=3, save_stats=1),
    ),
    OpCase(
        "ConvTranspose", "ConvTranspose-float64",
        lambda g: g.op("ConvTranspose", g.input("x", (1, 3, 5, 5)), _c(g, (3, 4, 3, 3), 8), _c(g, (4,), 9), strides=(2, 2)),
        dtype="float64", rtol=1e-12, atol=1e-13,
    ),
)


def build_case(case: OpCase) -> Graph:
    g = GraphBuilder(case.id.replace("-", "_"), dtype=case.dtype)
    out = case.build(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def case_inputs(graph: Graph, domain: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        v = graph.values[name]
        if v.dtype == "bool":
            arr = rng.random(v.shape) < 0.5
        elif domain == "positive":
            arr = rng.uniform(0.5, 2.0, v.shape)
        elif domain == "ints":
            arr = rng.integers(-2, 3, v.shape)
        else:
            arr = rng.standard_normal(v.shape)
        out[name] = np.asarray(arr).astype(v.dtype)
    return out


def kernel_params(cases: tuple[OpCase, ...] = CASES) -> list[object]:
    """Cases as pytest params; a case with a known bug is a strict xfail."""
    return [
        pytest.param(c, id=c.id, marks=pytest.mark.xfail(strict=True, reason=c.bug))
        if c.bug
        else pytest.param(c, id=c.id)
        for c in cases
    ]


def run_as_one_kernel(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    prog = build_program(FusedGraph.singletons(graph))
    assert prog.kernel_count == 1
    return {k: np.array(v, copy=True) for k, v in prog.run(inputs).items()}


def assert_agrees(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, what: str) -> None:
    assert got.shape == want.shape, what
    if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


# ---- the catalogue ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_op_declares_shape_rule_reference_and_codegen_rule(name: str) -> None:
    op = CATALOGUE[name]
    assert op.name == name
    assert op.kind in ("elementwise", "reduction", "contraction", "window", "layout", "attention", "opaque")
    assert callable(op.infer), f"{name} has no shape rule"
    assert callable(op.reference), f"{name} has no numpy reference"
    assert rule_kind(name) is not None, f"{name} has no codegen rule"
    assert op.doc, f"{name} has no one-line doc"


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_codegen_rule_matches_op_kind(name: str) -> None:
    allowed = {
        "elementwise": {"scalar"},
        "reduction": {"reduce", "expand"},
        "contraction": {"contraction"},
        "window": {"window"},
        "attention": {"attention"},
        "opaque": {"opaque"},
        "layout": {"layout", "scalar"},  # Expand is an index map inside a loop nest
    }
    assert rule_kind(name) in allowed[CATALOGUE[name].kind]


def test_every_catalogue_op_has_a_kernel_case() -> None:
    missing = sorted(set(CATALOGUE) - {c.op for c in CASES})
    assert not missing, f"ops without a case in CASES (add one): {missing}"


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_graph_is_the_op_alone(case: OpCase) -> None:
    graph = build_case(case)
    assert [n.op for n in graph.nodes] == [case.op]


# ---- the interpreter: shape rule and reference agree ---------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_output_has_declared_shape_and_dtype(case: OpCase) -> None:
    graph = build_case(case)
    outs = run_graph(graph, case_inputs(graph, case.domain), dtype=None)
    for name, arr in outs.items():
        v = graph.values[name]
        assert arr.shape == v.shape, name
        assert str(arr.dtype) == v.dtype, name


# ---- codegen: one kernel per op agrees with the interpreter --------------------------------------
@pytest.mark.parametrize("case", kernel_params())
def test_kernel_matches_interpreter_in_graph_dtype(case: OpCase) -> None:
    graph = build_case(case)
    inputs = case_inputs(graph, case.domain)
    got = run_as_one_kernel(graph, inputs)
    want = run_graph(graph, inputs, dtype=None)
    for name in graph.outputs:
        assert got[name].dtype == want[name].dtype, name
        assert_agrees(got[name], want[name], case.rtol, case.atol, f"{case.id}:{name}")


@pytest.mark.parametrize("case", kernel_params())
def test_kernel_matches_float64_interpreter(case: OpCase) -> None:
    graph = build_case(case)
    inputs = case_inputs(graph, case.domain, seed=1)
    got = run_as_one_kernel(graph, inputs)
    want = run_graph(graph, inputs, dtype="float64")
    for name in graph.outputs:
        rtol, atol = (
            (F64_RTOL, F64_ATOL)
            if graph.values[name].dtype != "float64"
            else (case.rtol, case.atol)
        )
        assert_agrees(got[name], want[name], rtol, atol, f"{case.id}:{name}")


# ---- special values: NaN and infinities mean what numpy says ---------------------------------------
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -3.0], dtype=np.float32
)
NAN_BUGS: dict[str, str] = {}


def _special_params() -> list[object]:
    ops = [
        n
        for n, op in sorted(CATALOGUE.items())
        if op.kind == "elementwise" and n not in ("Cast", "Where", "BiasAdd", "BatchNorm")
    ]
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=NAN_BUGS[n]))
        if n in NAN_BUGS
        else n
        for n in ops
    ]


@pytest.mark.parametrize("name", _special_params())
def test_elementwise_kernel_keeps_nan_and_inf_semantics(name: str) -> None:
    """Every pair of special values (NaN, +-inf, +-0, ...) through the op, kernel vs interpreter."""
    g = GraphBuilder(f"special_{name}")
    n = len(SPECIAL)
    arity = CATALOGUE[name].arity
    least = arity[0] if isinstance(arity, tuple) else arity  # GeluGrad's saved gate is optional
    operands = [g.input("a", (n, n))] + [g.input("b", (n, n))] * (least == 2)
    g.output(g.op(name, *operands))
    graph = g.build()
    inputs = {"a": np.repeat(SPECIAL, n).reshape(n, n), "b": np.tile(SPECIAL, n).reshape(n, n)}
    inputs = {k: inputs[k] for k in graph.inputs}
    got = run_as_one_kernel(graph, inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype=None)[graph.outputs[0]]
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=F32_RTOL, atol=F32_ATOL, equal_nan=True)


@pytest.mark.parametrize(
    "name",
    [
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
    ],
)
def test_reduction_kernel_propagates_nan(name: str) -> None:
    g = GraphBuilder(f"nan_{name}")
    g.output(g.op(name, g.input("x", (3, 5)), axes=(-1,), keepdims=True))
    graph = g.build()
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    x[0, 2] = np.nan
    x[1, 0] = np.nan
    got = run_as_one_kernel(graph, {"x": x})[graph.outputs[0]]
    want = run_graph(graph, {"x": x}, dtype=None)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, equal_nan=True)


@pytest.mark.parametrize(
    ("x", "attrs"),
    [
        # the flat kernel reading the input in place (over a task's planes at once), then over a
        # -inf padded plane
        ((2, 3, 9, 9), {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}),
        ((2, 5, 7, 7), {"kernel_shape": (3, 3), "strides": (2, 2), "dilations": (1, 2)}),
        # planes of 961: a task's planes in chunks of two and a last one (pool.POOL_RUN_CHUNK)
        ((2, 5, 31, 31), {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}),
        ((1, 3, 9, 9), {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),
        # rows wider than pool.POOL_FLAT_MAX_WIDTH
        ((1, 2, 5, 60), {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),
        # strided with pads, dilations: the phase planes
        ((1, 3, 12, 12), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
        ((1, 2, 11, 13), {"kernel_shape": (2, 3), "strides": (3, 2), "dilations": (2, 1), "pads": (1, 0, 1, 1), "ceil_mode": 1}),
    ],
)
def test_max_pool_kernel_propagates_nan_and_keeps_infinities(x: tuple[int, ...], attrs: dict[str, object]) -> None:
    """A window holding a NaN gives NaN wherever it sits in the window; +-inf are ordinary values."""
    g = GraphBuilder("nan_maxpool")
    g.output(g.op("MaxPool", g.input("x", x), **attrs))
    graph = g.build()
    v = np.random.default_rng(3).standard_normal(x).astype(np.float32)
    flat = v.reshape(-1)
    flat[::7] = np.nan
    flat[3::11] = np.inf
    flat[5::13] = -np.inf
    got = run_as_one_kernel(graph, {"x": v})[graph.outputs[0]]
    want = run_graph(graph, {"x": v}, dtype=None)[graph.outputs[0]]
    assert np.isnan(want).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(got, want)


def test_max_pool_rule_picks_each_kernel() -> None:
    """The NaN test's geometries above reach every MaxPool kernel (pool.max_pool_algo)."""
    from fusiontune.codegen._window import window_of
    from fusiontune.codegen.pool import max_pool_algo

    def algo(x: tuple[int, ...], **attrs: object) -> str:
        g = GraphBuilder("rule")
        g.output(g.op("MaxPool", g.input("x", x), **attrs))
        graph = g.build()
        node = graph.nodes[0]
        return max_pool_algo(window_of({**CATALOGUE["MaxPool"].attrs, **node.attrs}, x, node.attrs["kernel_shape"],
                                       graph.values[node.outputs[0]].shape))

    assert algo((2, 3, 9, 9), kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1) == "flat"
    assert algo((1, 2, 5, 60), kernel_shape=(3, 3), pads=(1, 1, 1, 1)) == "row"
    assert algo((1, 3, 12, 12), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)) == "phase"
    assert algo((1, 2, 11, 13), kernel_shape=(2, 3), strides=(3, 2), dilations=(2, 1), pads=(1, 0, 1, 1), ceil_mode=1) == "phase"


def test_float16_tensors_are_refused_cleanly() -> None:
    """numba has no float16 arithmetic: codegen says so (NotFusable), it does not crash in numba."""
    from fusiontune.codegen import NotFusable

    g = GraphBuilder("f16")
    g.output(g.cast(g.input("x", (4, 5)), "float16"))
    with pytest.raises(NotFusable, match="float16"):
        build_program(FusedGraph.singletons(g.build()))


@pytest.mark.parametrize(
    ("x", "attrs", "call"),
    [
        # in place over a task's planes, outputs at stride 2 (SqueezeNet's 3x3 s2 ceil_mode pools)
        ((2, 5, 31, 31), {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, "rg2("),
        # over a -inf padded plane (stride 1)
        ((1, 3, 9, 9), {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}, "rg1("),
        # phase planes (pads, a ceil_mode overhang): the outputs read at unit stride out of the grid
        ((2, 3, 20, 19), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, "rg1("),
        ((2, 2, 15, 18), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 1, 0, 1), "ceil_mode": 1}, "rg1("),
        # rows of 3 outputs: the numba loop
        ((2, 4, 7, 7), {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, ""),
    ],
)
def test_max_pool_outputs_copied_out_of_the_scratch_in_vectors(x: tuple[int, ...], attrs: dict[str, object],
                                                               call: str) -> None:
    """Output rows of at least pool.GATHER_MIN_WIDTH are copied out of a MaxPool kernel's scratch
    by microkernel.rows_copy (``rg1`` at unit stride, ``rg2`` at the windows' stride 2), every
    plane of every image to its own place; NaN and infinities pass through."""
    from fusiontune.codegen import kernel_source

    g = GraphBuilder("gather_maxpool")
    g.output(g.op("MaxPool", g.input("x", x), **attrs))
    graph = g.build()
    src = kernel_source(graph, [n.name for n in graph.nodes], {}).source
    assert (call in src) if call else "rg1(" not in src and "rg2(" not in src
    v = np.random.default_rng(4).standard_normal(x).astype(np.float32)
    flat = v.reshape(-1)
    flat[::17] = np.nan
    flat[3::19] = np.inf
    got = run_as_one_kernel(graph, {"x": v})[graph.outputs[0]]
    np.testing.assert_array_equal(got, run_graph(graph, {"x": v}, dtype=None)[graph.outputs[0]])
