"""The builder DSL: write graphs in Python the way the seeds write MindSpore Cells.

    g = GraphBuilder("mindspore_basic")
    x = g.input("x", (4, 4))
    a = g.mul(x, 2.0)
    g.output(g.add(a, 1.0))
    graph = g.build()

A custom composite op is a plain Python function over builder tensors; ``with g.scope("MyOp")``
only prefixes node names, so fusion crosses the op's boundary exactly as in seed 000.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusiontune.ir.graph import Graph, Node, Shape, Value
from fusiontune.ir.ops import get_op, infer_node

Operand = "Tensor | float | int | np.ndarray"


@dataclass(frozen=True)
class Tensor:
    """A handle on a value while a graph is being built."""

    builder: GraphBuilder
    name: str

    @property
    def shape(self) -> Shape:
        return self.builder.values[self.name].shape

    @property
    def dtype(self) -> str:
        return self.builder.values[self.name].dtype

    def __add__(self, o: Any) -> Tensor:
        return self.builder.add(self, o)

    def __radd__(self, o: Any) -> Tensor:
        return self.builder.add(o, self)

    def __sub__(self, o: Any) -> Tensor:
        return self.builder.sub(self, o)

    def __rsub__(self, o: Any) -> Tensor:
        return self.builder.sub(o, self)

    def __mul__(self, o: Any) -> Tensor:
        return self.builder.mul(self, o)

    def __rmul__(self, o: Any) -> Tensor:
        return self.builder.mul(o, self)

    def __truediv__(self, o: Any) -> Tensor:
        return self.builder.div(self, o)

    def __rtruediv__(self, o: Any) -> Tensor:
        return self.builder.div(o, self)

    def __neg__(self) -> Tensor:
        return self.builder.neg(self)

    def __pow__(self, o: Any) -> Tensor:
        return self.builder.pow(self, o)

    def __matmul__(self, o: Tensor) -> Tensor:
        return self.builder.matmul(self, o)


class GraphBuilder:
    """Accumulates values and nodes; ``build()`` returns the immutable :class:`Graph`."""

    def __init__(self, name: str, dtype: str = "float32") -> None:
        self.name = name
        self.dtype = dtype
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.constants: dict[str, np.ndarray] = {}
        self._scopes: list[str] = []
        self._count: dict[str, int] = {}

    # ---- naming --------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix the names of nodes made inside (a composite op's boundary, seed 000's MyOp)."""
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def _fresh(self, stem: str) -> str:
        prefix = "/".join(self._scopes)
        base = f"{prefix}/{stem}" if prefix else stem
        while True:
            i = self._count.get(base, 0)
            self._count[base] = i + 1
            name = f"{base}_{i}"
            if name not in self.values:
                return name

    # ---- leaves --------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> Tensor:
        if name in self.values:
            raise ValueError(f"value {name!r} already exists")
        self.values[name] = Value(name, tuple(int(d) for d in shape), dtype or self.dtype)
        self.inputs.append(name)
        return Tensor(self, name)

    def const(self, array: Any, name: str | None = None, dtype: str | None = None) -> Tensor:
        arr = np.asarray(array, dtype=dtype)
        if dtype is None and (arr.dtype.kind == "f" or not isinstance(array, np.ndarray)):
            # Float weights follow the graph's dtype: a float64 array would silently promote
            # everything downstream of it.
            arr = arr.astype(self.dtype)
        name = name or self._fresh("const")
        self.constants[name] = arr
        self.values[name] = Value(name, tuple(arr.shape), str(arr.dtype))
        return Tensor(self, name)

    def output(self, *tensors: Tensor) -> None:
        self.outputs.extend(t.name for t in tensors)

    def build(self) -> Graph:
        if not self.outputs:
            raise ValueError(f"graph {self.name} has no outputs")
        g = Graph(self.name, self.values, tuple(self.nodes), tuple(self.inputs), tuple(self.outputs), self.constants)
        g.validate()
        return g

    # ---- generic op ----------------------------------------------------------------------
    def _operand(self, x: Any, like: str) -> Tensor:
        if isinstance(x, Tensor):
            return x
        return self.const(np.asarray(x, dtype=like))

    def op(self, op: str, *inputs: Any, n_outputs: int = 1, **attrs: Any) -> Any:
        """Add a node of ``op``; Python numbers become scalar constants of the operands' dtype."""
        like = next((t.dtype for t in inputs if isinstance(t, Tensor)), self.dtype)
        if like not in ("float32", "float64", "float16"):
            like = self.dtype
        ins = [self._operand(x, like) for x in inputs]
        get_op(op)  # fail early on an unknown op
        node_name = self._fresh(op)
        outs = tuple(f"{node_name}:{i}" if n_outputs > 1 else node_name for i in range(n_outputs))
        node = Node(node_name, op, tuple(t.name for t in ins), outs, attrs)
        for o, (shape, dtype) in zip(outs, infer_node(node, [self.values[t.name] for t in ins]), strict=True):
            self.values[o] = Value(o, shape, dtype)
        self.nodes.append(node)
        result = tuple(Tensor(self, o) for o in outs)
        return result if n_outputs > 1 else result[0]

    # ---- ops -----------------------------------------------------------------------------
    def add(self, a: Any, b: Any) -> Tensor:
        return self.op("Add", a, b)

    def sub(self, a: Any, b: Any) -> Tensor:
        return self.op("Sub", a, b)

    def mul(self, a: Any, b: Any) -> Tensor:
        return self.op("Mul", a, b)

    def div(self, a: Any, b: Any) -> Tensor:
        return self.op("Div", a, b)

    def pow(self, a: Any, b: Any) -> Tensor:
        return self.op("Pow", a, b)

    def maximum(self, a: Any, b: Any) -> Tensor:
        return self.op("Maximum", a, b)

    def minimum(self, a: Any, b: Any) -> Tensor:
        return self.op("Minimum", a, b)

    def greater(self, a: Any, b: Any) -> Tensor:
        return self.op("Greater", a, b)

    def less(self, a: Any, b: Any) -> Tensor:
        return self.op("Less", a, b)

    def equal(self, a: Any, b: Any) -> Tensor:
        return self.op("Equal", a, b)

    def neg(self, x: Tensor) -> Tensor:
        return self.op("Neg", x)

    def exp(self, x: Tensor) -> Tensor:
        return self.op("Exp", x)

    def log(self, x: Tensor) -> Tensor:
        return self.op("Log", x)

    def sqrt(self, x: Tensor) -> Tensor:
        return self.op("Sqrt", x)

    def rsqrt(self, x: Tensor) -> Tensor:
        return self.op("Rsqrt", x)

    def reciprocal(self, x: Tensor) -> Tensor:
        return self.op("Reciprocal", x)

    def tanh(self, x: Tensor) -> Tensor:
        return self.op("Tanh", x)

    def erf(self, x: Tensor) -> Tensor:
        return self.op("Erf", x)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self.op("Sigmoid", x)

    def relu(self, x: Tensor) -> Tensor:
        return self.op("Relu", x)

    def gelu(self, x: Tensor, approximate: str = "none") -> Tensor:
        return self.op("Gelu", x, approximate=approximate)

    def silu(self, x: Tensor) -> Tensor:
        return self.op("Silu", x)

    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        return self.op("SwiGlu", gate, up)

    def cast(self, x: Tensor, to: str) -> Tensor:
        return self.op("Cast", x, to=to)

    def where(self, cond: Tensor, a: Any, b: Any) -> Tensor:
        return self.op("Where", cond, a, b)

    def bias_add(self, x: Tensor, bias: Tensor) -> Tensor:
        return self.op("BiasAdd", x, bias)

    def reduce_sum(self, x: Tensor, axes: Sequence[int] | int = -1, keepdims: bool = True) -> Tensor:
        return self.op("ReduceSum", x, axes=_axes(axes), keepdims=keepdims)

    def reduce_mean(self, x: Tensor, axes: Sequence[int] | int = -1, keepdims: bool = True) -> Tensor:
        return self.op("ReduceMean", x, axes=_axes(axes), keepdims=keepdims)

    def reduce_max(self, x: Tensor, axes: Sequence[int] | int = -1, keepdims: bool = True) -> Tensor:
        return self.op("ReduceMax", x, axes=_axes(axes), keepdims=keepdims)

    def softmax(self, x: Tensor, axis: int = -1) -> Tensor:
        return self.op("Softmax", x, axis=axis)

    def layer_norm(self, x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
        return self.op("LayerNorm", x, gamma, beta, eps=eps)

    def rms_norm(self, x: Tensor, gamma: Tensor, eps: float = 1e-6) -> Tensor:
        return self.op("RMSNorm", x, gamma, eps=eps)

    def matmul(self, a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
        return self.op("MatMul", a, b) if bias is None else self.op("MatMul", a, b, bias)

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return self.op("Reshape", x, shape=tuple(shape))

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        return self.op("Transpose", x, perm=tuple(perm))

    def concat(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        return self.op("Concat", *xs, axis=axis)

    def split(self, x: Tensor, sizes: Sequence[int], axis: int) -> tuple[Tensor, ...]:
        return self.op("Split", x, n_outputs=len(sizes), axis=axis, sizes=tuple(sizes))

    def slice(
        self, x: Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int], steps: Sequence[int] | None = None
    ) -> Tensor:
        return self.op(
            "Slice", x, starts=tuple(starts), ends=tuple(ends), axes=tuple(axes), steps=tuple(steps or (1,) * len(axes))
        )

    def expand(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return self.op("Expand", x, shape=tuple(shape))

    # ---- decomposed forms (what exporters emit; the GraphFusion passes fold them back) -------
    def softmax_decomposed(self, x: Tensor) -> Tensor:
        """max / sub / exp / sum / div over the last axis."""
        m = self.reduce_max(x)
        e = self.exp(self.sub(x, m))
        return self.div(e, self.reduce_sum(e))

    def layer_norm_decomposed(self, x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
        """mean, centre, mean of squares, add eps, sqrt, divide, scale, shift."""
        mean = self.reduce_mean(x)
        d = self.sub(x, mean)
        var = self.reduce_mean(self.pow(d, 2.0))
        return self.add(self.mul(self.div(d, self.sqrt(self.add(var, eps))), gamma), beta)

    def rms_norm_decomposed(self, x: Tensor, gamma: Tensor, eps: float = 1e-6) -> Tensor:
        """mean of squares, add eps, rsqrt, scale (the llama form)."""
        ms = self.reduce_mean(self.mul(x, x))
        return self.mul(self.mul(x, self.rsqrt(self.add(ms, eps))), gamma)

    def gelu_decomposed(self, x: Tensor) -> Tensor:
        """0.5 * x * (1 + erf(x / sqrt(2))), as torch and MindSpore export the exact GELU."""
        return self.mul(self.mul(x, 0.5), self.add(self.erf(self.div(x, float(np.sqrt(2.0)))), 1.0))

    def silu_decomposed(self, x: Tensor) -> Tensor:
        return self.mul(x, self.sigmoid(x))


def _axes(axes: Sequence[int] | int) -> tuple[int, ...]:
    return (axes,) if isinstance(axes, int) else tuple(axes)
