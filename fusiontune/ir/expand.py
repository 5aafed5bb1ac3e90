"""Expanders: the fused normalization ops written as primitive nodes.

Codegen lowers a fused op (Softmax, LogSoftmax, LayerNorm, RMSNorm, AddLayerNorm, AddRmsNorm)
through its expansion, the way MindSpore's graph-kernel expanders do, and NormSplitFusionPass uses
the same expansions to cut an op between its statistics and its elementwise part. Each expansion
equals the op's numpy reference up to rounding; tests check that.

A LayerNorm or AddLayerNorm with ``variance="one_pass"`` takes its variance as
``max(E[x^2] - E[x]^2, 0)`` (both means in one sweep over x) instead of ``E[(x - E[x])^2]``.

An expansion returns two lists of nodes: ``stats`` (the reductions and everything computed per
row) and ``apply`` (the elementwise part that produces the op's outputs). The apply part recomputes
what it needs from the op's inputs, so cutting between the two lists is a valid split: the apply
part reads only the op's inputs and the per-row statistics.

A forward normalization with ``save_stats=1`` names its per-row mean and rstd nodes as its extra
outputs, so its kernel writes them. The backward ops of the fused ops (ir/_ops_grad.py) expand
too: SoftmaxGrad, LayerNormGrad and RmsNormGrad (codegen lowers them through it, as the forward
norms), and GeluGrad, GeluCdf and ReluGrad, which codegen writes as scalar rules instead
(:data:`ELEMENTWISE_EXPANDABLE`). Each expansion is the primitive form the vector-Jacobian rules
wrote before the grad ops existed: a backward pass that is off (or an application bisection
denies) splices it into the graph in place of the op (passes/graph/grad_fusion.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import infer_node, normalize_axis

EXPANDABLE = (
    "Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "AddLayerNorm", "AddRmsNorm",
    "SoftmaxGrad", "LayerNormGrad", "RmsNormGrad",
)
"""Ops that codegen lowers through their expansion (and NormSplitFusionPass may cut)."""
ELEMENTWISE_EXPANDABLE = ("GeluGrad", "GeluCdf", "ReluGrad")
"""Elementwise ops with an expansion (their primitive form) that codegen writes as scalar rules."""
# AttentionGrad expands too (into MatMuls, a Softmax and a SoftmaxGrad, its rule's former form);
# codegen runs it as a kernel of its own (codegen/attention_grad.py), not through the expansion.
_SQRT_2 = float(np.sqrt(2.0))
_SQRT_2PI = float(np.sqrt(2.0 * np.pi))
_TANH_C = float(np.sqrt(2.0 / np.pi))
_TANH_K = 0.044715


@dataclass(frozen=True)
class Expansion:
    """Primitive nodes standing for one fused node, the new values, and new scalar constants."""

    stats: tuple[Node, ...]
    apply: tuple[Node, ...]
    values: Mapping[str, Value]
    constants: Mapping[str, np.ndarray]

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.stats + self.apply


class _Writer:
    def __init__(self, node: Node, values: Mapping[str, Value]) -> None:
        self.node = node
        self.values = dict(values)
        self.new_values: dict[str, Value] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.dtype = values[node.inputs[0]].dtype
        self._i = 0

    def const(self, v: float) -> str:
        name = f"{self.node.name}/c{len(self.constants)}"
        arr = np.asarray(v, dtype=self.dtype)
        self.constants[name] = arr
        self.new_values[name] = self.values[name] = Value(name, (), self.dtype)
        return name

    def op(self, op: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        name = f"{self.node.name}/{op}_{self._i}"
        self._i += 1
        out = out or name
        node = Node(name, op, tuple(inputs), (out,), attrs, origin=self.node.origin)
        (shape, dtype), = infer_node(node, [self.values[i] for i in inputs])
        self.new_values[out] = self.values[out] = Value(out, shape, dtype)
        self.nodes.append(node)
        return out

    def mark(self) -> int:
        return len(self.nodes)


def expand(node: Node, values: Mapping[str, Value]) -> Expansion:
    """Expand a fused normalization node into primitives; the outputs keep their names.

    Raises:
        ValueError: ``node.op`` has no expansion.
    """
    w = _Writer(node, values)
    ins = node.inputs
    outs = node.outputs
    if node.op == "Softmax":
        axis = normalize_axis(node.attr("axis", -1), len(values[ins[0]].shape))
        m = w.op("ReduceMax", ins[0], axes=(axis,), keepdims=True)
        s = w.op("ReduceSum", w.op("Exp", w.op("Sub", ins[0], m)), axes=(axis,), keepdims=True)
        r = w.op("Reciprocal", s)
        cut = w.mark()
        w.op("Mul", w.op("Exp", w.op("Sub", ins[0], m)), r, out=outs[0])
    elif node.op == "LogSoftmax":
        # x - max - log(sum(exp(x - max))): the shift keeps exp from overflowing, and the result
        # is a difference, never the log of an underflowed softmax.
        axis = normalize_axis(node.attr("axis", -1), len(values[ins[0]].shape))
        m = w.op("ReduceMax", ins[0], axes=(axis,), keepdims=True)
        s = w.op("ReduceSum", w.op("Exp", w.op("Sub", ins[0], m)), axes=(axis,), keepdims=True)
        lse = w.op("Log", s)
        cut = w.mark()
        w.op("Sub", w.op("Sub", ins[0], m), lse, out=outs[0])
    elif node.op in ("LayerNorm", "AddLayerNorm"):
        x = ins[0] if node.op == "LayerNorm" else w.op("Add", ins[0], ins[1], out=outs[1])
        gamma, beta = ins[-2], ins[-1]
        saved = outs[1:] if node.op == "LayerNorm" else outs[2:]  # (mean, rstd) with save_stats
        mean, rstd = _layer_norm_stats(w, node, x, *(saved or (None, None)))
        cut = w.mark()
        x2 = x if node.op == "LayerNorm" else w.op("Add", ins[0], ins[1])
        y = w.op("Mul", w.op("Mul", w.op("Sub", x2, mean), rstd), gamma)
        w.op("Add", y, beta, out=outs[0])
    elif node.op in ("RMSNorm", "AddRmsNorm"):
        x = ins[0] if node.op == "RMSNorm" else w.op("Add", ins[0], ins[1], out=outs[1])
        gamma = ins[-1]
        saved = outs[1:] if node.op == "RMSNorm" else outs[2:]  # (rstd,) with save_stats
        rstd = _rms_norm_rstd(w, node, x, *(saved or (None,)))
        cut = w.mark()
        x2 = x if node.op == "RMSNorm" else w.op("Add", ins[0], ins[1])
        w.op("Mul", w.op("Mul", x2, rstd), gamma, out=outs[0])
    elif node.op == "SoftmaxGrad":
        y, dy = ins
        axis = normalize_axis(node.attr("axis", -1), len(values[y].shape))
        s = w.op("ReduceSum", w.op("Mul", dy, y), axes=(axis,), keepdims=True)
        cut = w.mark()
        w.op("Mul", y, w.op("Sub", dy, s), out=outs[0])
    elif node.op == "LayerNormGrad":
        x, gamma, dy = ins[:3]
        mean, rstd = ins[3:] if len(ins) == 5 else _layer_norm_stats(w, node, x)
        xhat = w.op("Mul", w.op("Sub", x, mean), rstd)
        gh = w.op("Mul", dy, gamma)
        m1 = w.op("ReduceMean", gh, axes=(-1,), keepdims=True)
        m2 = w.op("ReduceMean", w.op("Mul", gh, xhat), axes=(-1,), keepdims=True)
        cut = w.mark()
        xhat2 = w.op("Mul", w.op("Sub", x, mean), rstd)
        inner = w.op("Sub", w.op("Sub", w.op("Mul", dy, gamma), m1), w.op("Mul", xhat2, m2))
        w.op("Mul", rstd, inner, out=outs[0])
        w.op("Mul", dy, xhat2, out=outs[1])
    elif node.op == "RmsNormGrad":
        x, gamma, dy = ins[:3]
        r = ins[3] if len(ins) == 4 else _rms_norm_rstd(w, node, x)
        m = w.op("ReduceMean", w.op("Mul", w.op("Mul", dy, gamma), x), axes=(-1,), keepdims=True)
        cut = w.mark()
        r3 = w.op("Mul", r, w.op("Mul", r, r))
        w.op("Sub", w.op("Mul", r, w.op("Mul", dy, gamma)), w.op("Mul", w.op("Mul", x, r3), m), out=outs[0])
        w.op("Mul", dy, w.op("Mul", x, r), out=outs[1])
    elif node.op in ELEMENTWISE_EXPANDABLE:
        cut = 0
        _expand_elementwise(w, node)
    elif node.op == "AttentionGrad":
        cut = 0
        _expand_attention_grad(w, node)
    else:
        raise ValueError(f"no expansion for {node.op}")
    return Expansion(tuple(w.nodes[:cut]), tuple(w.nodes[cut:]), w.new_values, w.constants)


def _layer_norm_stats(
    w: _Writer, node: Node, x: str, mean_out: str | None = None, rstd_out: str | None = None
) -> tuple[str, str]:
    """LayerNorm's per-row (mean, rstd) of ``x`` as primitives, with the forward's ``variance``."""
    eps = node.attr("eps", 1e-5)
    mean = w.op("ReduceMean", x, axes=(-1,), keepdims=True, out=mean_out)
    if node.attr("variance", "two_pass") == "one_pass":
        # One sweep: E[x] and E[x^2] read x in the same round; var = max(E[x^2] - E[x]^2, 0).
        msq = w.op("ReduceMean", w.op("Mul", x, x), axes=(-1,), keepdims=True)
        diff = w.op("Sub", msq, w.op("Mul", mean, mean))
        var = w.op("Maximum", diff, w.const(0.0))
    else:
        d = w.op("Sub", x, mean)
        var = w.op("ReduceMean", w.op("Mul", d, d), axes=(-1,), keepdims=True)
    return mean, w.op("Rsqrt", w.op("Add", var, w.const(eps)), out=rstd_out)


def _rms_norm_rstd(w: _Writer, node: Node, x: str, rstd_out: str | None = None) -> str:
    """RMSNorm's per-row ``1 / sqrt(mean(x^2) + eps)`` of ``x`` as primitives."""
    ms = w.op("ReduceMean", w.op("Mul", x, x), axes=(-1,), keepdims=True)
    return w.op("Rsqrt", w.op("Add", ms, w.const(node.attr("eps", 1e-6))), out=rstd_out)


def _gelu_cdf(w: _Writer, x: str, approximate: str, out: str | None = None) -> str:
    """``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, or the tanh form's ``(1 + tanh(u)) / 2``."""
    if approximate == "tanh":
        cube = w.op("Mul", w.op("Mul", w.op("Mul", x, x), x), w.const(_TANH_K))
        t = w.op("Tanh", w.op("Mul", w.op("Add", x, cube), w.const(_TANH_C)))
        return w.op("Mul", w.op("Add", t, w.const(1.0)), w.const(0.5), out=out)
    erf = w.op("Erf", w.op("Div", x, w.const(_SQRT_2)))
    return w.op("Mul", w.op("Add", erf, w.const(1.0)), w.const(0.5), out=out)


def _expand_elementwise(w: _Writer, node: Node) -> None:
    """GeluGrad, GeluCdf and ReluGrad as primitives (the forms of ir/_ops_grad.py's docstring)."""
    ins, out = node.inputs, node.outputs[0]
    approximate = node.attr("approximate", "none")
    if node.op == "GeluCdf":
        _gelu_cdf(w, ins[0], approximate, out)
    elif node.op == "ReluGrad":
        y, dy = ins
        w.op("Where", w.op("Greater", y, w.const(0.0)), dy, w.const(0.0), out=out)
    elif len(ins) == 2 and approximate == "tanh":
        # The rule's form before GeluGrad: (1 + t) / 2 + x / 2 * (1 - t^2) * u', t = tanh(u).
        x, dy = ins
        x2 = w.op("Mul", x, x)
        cube = w.op("Mul", w.op("Mul", x2, x), w.const(_TANH_K))
        t = w.op("Tanh", w.op("Mul", w.op("Add", x, cube), w.const(_TANH_C)))
        du = w.op("Mul", w.op("Add", w.op("Mul", x2, w.const(3.0 * _TANH_K)), w.const(1.0)), w.const(_TANH_C))
        half = w.op("Mul", w.op("Add", t, w.const(1.0)), w.const(0.5))
        tail = w.op("Mul", w.op("Mul", w.op("Mul", x, w.const(0.5)), w.op("Sub", w.const(1.0), w.op("Mul", t, t))), du)
        w.op("Mul", dy, w.op("Add", half, tail), out=out)
    elif approximate == "tanh":
        # With the saved c = (1 + t) / 2: gelu' = c + 2 x c (1 - c) u', no tanh.
        x, dy, c = ins
        du = w.op("Mul", w.op("Add", w.op("Mul", w.op("Mul", x, x), w.const(3.0 * _TANH_K)), w.const(1.0)), w.const(_TANH_C))
        tail = w.op("Mul", w.op("Mul", w.op("Mul", x, w.const(2.0)), w.op("Mul", c, w.op("Sub", w.const(1.0), c))), du)
        w.op("Mul", dy, w.op("Add", c, tail), out=out)
    else:
        x, dy = ins[:2]
        cdf = ins[2] if len(ins) == 3 else _gelu_cdf(w, x, approximate)
        pdf = w.op("Div", w.op("Exp", w.op("Mul", w.op("Mul", x, x), w.const(-0.5))), w.const(_SQRT_2PI))
        w.op("Mul", dy, w.op("Add", cdf, w.op("Mul", x, pdf)), out=out)


def _expand_attention_grad(w: _Writer, node: Node) -> None:
    """Attention's backward as the rule wrote it before AttentionGrad: MatMuls around a Softmax of
    the recomputed scores and a SoftmaxGrad (no stats/apply cut: it holds contractions)."""
    q, k, v, dy = node.inputs[:4]
    dq, dk, dv = node.outputs
    scale = float(node.attr("scale", 1.0))
    rank = len(w.values[q].shape)
    perm = (*range(rank - 2), rank - 1, rank - 2)

    def t(x: str) -> str:
        return w.op("Transpose", x, perm=perm)

    s = w.op("Mul", w.op("MatMul", q, t(k)), w.const(scale))
    if len(node.inputs) == 5:
        s = w.op("Add", s, node.inputs[4])
    p = w.op("Softmax", s, axis=-1)
    dp = w.op("MatMul", dy, t(v))
    ds = w.op("SoftmaxGrad", p, dp, axis=-1)
    w.op("Mul", w.op("MatMul", ds, k), w.const(scale), out=dq)
    w.op("Mul", w.op("MatMul", t(ds), q), w.const(scale), out=dk)
    w.op("MatMul", t(p), dy, out=dv)
