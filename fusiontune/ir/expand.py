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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import infer_node, normalize_axis

EXPANDABLE = ("Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "AddLayerNorm", "AddRmsNorm")


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
        eps = node.attr("eps", 1e-5)
        mean = w.op("ReduceMean", x, axes=(-1,), keepdims=True)
        if node.attr("variance", "two_pass") == "one_pass":
            # One sweep: E[x] and E[x^2] read x in the same round; var = max(E[x^2] - E[x]^2, 0).
            msq = w.op("ReduceMean", w.op("Mul", x, x), axes=(-1,), keepdims=True)
            diff = w.op("Sub", msq, w.op("Mul", mean, mean))
            var = w.op("Maximum", diff, w.const(0.0))
        else:
            d = w.op("Sub", x, mean)
            var = w.op("ReduceMean", w.op("Mul", d, d), axes=(-1,), keepdims=True)
        rstd = w.op("Rsqrt", w.op("Add", var, w.const(eps)))
        cut = w.mark()
        x2 = x if node.op == "LayerNorm" else w.op("Add", ins[0], ins[1])
        y = w.op("Mul", w.op("Mul", w.op("Sub", x2, mean), rstd), gamma)
        w.op("Add", y, beta, out=outs[0])
    elif node.op in ("RMSNorm", "AddRmsNorm"):
        x = ins[0] if node.op == "RMSNorm" else w.op("Add", ins[0], ins[1], out=outs[1])
        gamma = ins[-1]
        eps = node.attr("eps", 1e-6)
        ms = w.op("ReduceMean", w.op("Mul", x, x), axes=(-1,), keepdims=True)
        rstd = w.op("Rsqrt", w.op("Add", ms, w.const(eps)))
        cut = w.mark()
        x2 = x if node.op == "RMSNorm" else w.op("Add", ins[0], ins[1])
        w.op("Mul", w.op("Mul", x2, rstd), gamma, out=outs[0])
    else:
        raise ValueError(f"no expansion for {node.op}")
    return Expansion(tuple(w.nodes[:cut]), tuple(w.nodes[cut:]), w.new_values, w.constants)
