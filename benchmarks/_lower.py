"""One lowering of a fusiontune IR graph to JAX, torch and numexpr, for the peers benchmark.

The peers must compute the same math as fusiontune, so none of them gets a hand-written model:
:func:`lower` walks the *unfused* graph node by node and maps each op of the catalogue
(fusiontune/ir/ops.py) to ``jax.numpy`` / ``torch`` calls. The result is one Python function over
the graph inputs; ``jax.jit`` or ``torch.compile`` then traces the whole of it, so their compilers
do their own fusion. Shapes come from the graph's values (static), so Reshape / Expand need no
shape arithmetic. :func:`numexpr_expression` does the same for an all-elementwise graph, as one
numexpr string.

Each backend is a table ``op name -> rule(attrs, node, *arrays)``; an op a table lacks raises
:class:`Unsupported`, which the benchmark reports as "not lowered" instead of timing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fusiontune.ir.graph import Graph, Node
from fusiontune.ir.ops import (
    get_op,
    normalize_axes,
    normalize_axis,
    slice_index,
    window_attrs,
)

Rule = Callable[..., Any]


class Unsupported(NotImplementedError):
    """An op (or an attribute value) a backend's table has no rule for."""


# ---- shared window arithmetic ----------------------------------------------------------------
def _window_geometry(node: Node, graph: Graph, kernel: Sequence[int]) -> tuple[list[tuple[int, int]], list[int], tuple[int, ...], tuple[int, ...]]:
    """Padding that covers every window of the output (explicit begin pad, end pad extended or
    trimmed to what the last window needs), the output spatial sizes, strides and dilations."""
    x = graph.values[node.inputs[0]].shape
    out = graph.values[node.outputs[0]].shape
    spatial = len(x) - 2
    attrs = {**get_op(node.op).attrs, **node.attrs}
    strides, pads, dil = window_attrs(attrs, spatial)
    widths = []
    for i in range(spatial):
        span = dil[i] * (kernel[i] - 1) + 1
        need = (out[2 + i] - 1) * strides[i] + span
        widths.append((pads[i], max(need - x[2 + i] - pads[i], 0)))
    return widths, list(out[2:]), strides, dil


def _avg_pool_count(node: Node, graph: Graph) -> np.ndarray:
    """The divisor of every AveragePool output element, as the reference counts it (numpy)."""
    from fusiontune.ir.ops import _windows

    attrs = {**get_op(node.op).attrs, **node.attrs}
    x = graph.values[node.inputs[0]].shape
    kernel = tuple(attrs["kernel_shape"])
    ceil = bool(attrs.get("ceil_mode", 0))
    spatial = len(x) - 2
    _, pads, _ = window_attrs(attrs, spatial)
    axes = tuple(range(len(x), len(x) + spatial))
    if attrs.get("count_include_pad", 0):
        ones = np.pad(np.ones((1, 1, *x[2:])), [(0, 0), (0, 0)] + [(pads[i], pads[spatial + i]) for i in range(spatial)], constant_values=1)
        count = _windows(ones, kernel, {**attrs, "pads": (0,) * (2 * spatial)}, 0.0, ceil).sum(axis=axes)
    else:
        count = _windows(np.ones((1, 1, *x[2:])), kernel, attrs, 0.0, ceil).sum(axis=axes)
    return count.astype(np.float32)


def _attrs(node: Node) -> dict[str, Any]:
    return {**get_op(node.op).attrs, **node.attrs}


# ---- JAX -------------------------------------------------------------------------------------
def _jax_rules() -> dict[str, Rule]:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.scipy.special import erf

    def ln(x: Any, g: Any, b: Any, eps: float, mode: str) -> Any:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        if mode == "one_pass":
            var = jnp.maximum(jnp.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0)
        else:
            var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * g + b

    def rms(x: Any, g: Any, eps: float) -> Any:
        return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def reduce(fn: Callable[..., Any]) -> Rule:
        return lambda a, n, g, x: fn(x, axis=normalize_axes(a.get("axes"), x.ndim), keepdims=bool(a.get("keepdims", True)))

    def conv(a: dict[str, Any], n: Node, g: Graph, x: Any, w: Any, *bias: Any) -> Any:
        spatial = x.ndim - 2
        strides, pads, dil = window_attrs(a, spatial)
        letters = "DHW"[-spatial:]
        y = lax.conv_general_dilated(
            x, w, tuple(strides), [(pads[i], pads[spatial + i]) for i in range(spatial)],
            rhs_dilation=tuple(dil), dimension_numbers=(f"NC{letters}", f"OI{letters}", f"NC{letters}"),
            feature_group_count=int(a.get("group", 1)),
        )
        return y + bias[0].reshape((-1,) + (1,) * spatial) if bias else y

    def pool(a: dict[str, Any], n: Node, g: Graph, x: Any, init: float, op: Callable[..., Any]) -> Any:
        kernel = tuple(a["kernel_shape"])
        widths, out, strides, dil = _window_geometry(n, g, kernel)
        y = lax.reduce_window(x, init, op, (1, 1, *kernel), (1, 1, *strides), [(0, 0), (0, 0), *widths], window_dilation=(1, 1, *dil))
        return y[(slice(None), slice(None), *(slice(0, o) for o in out))]

    def avg_pool(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        return pool(a, n, g, x, 0.0, lax.add) / jnp.asarray(_avg_pool_count(n, g))

    def attention(a: dict[str, Any], n: Node, g: Graph, q: Any, k: Any, v: Any, *mask: Any) -> Any:
        s = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * a.get("scale", 1.0)
        if mask:
            s = s + mask[0]
        return jnp.matmul(jax.nn.softmax(s, axis=-1), v)

    def split(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        return tuple(jnp.split(x, np.cumsum(a["sizes"])[:-1].tolist(), axis=a["axis"]))

    def gather(a: dict[str, Any], n: Node, g: Graph, d: Any, i: Any) -> Any:
        axis = normalize_axis(a.get("axis", 0), d.ndim)
        return jnp.take(d, jnp.where(i < 0, i + d.shape[axis], i), axis=axis)

    def out_shape(n: Node, g: Graph) -> tuple[int, ...]:
        return g.values[n.outputs[0]].shape

    return {
        "Add": lambda a, n, g, x, y: x + y,
        "Sub": lambda a, n, g, x, y: x - y,
        "Mul": lambda a, n, g, x, y: x * y,
        "Div": lambda a, n, g, x, y: x / y,
        "Maximum": lambda a, n, g, x, y: jnp.maximum(x, y),
        "Minimum": lambda a, n, g, x, y: jnp.minimum(x, y),
        "Pow": lambda a, n, g, x, y: jnp.power(x, y),
        "Greater": lambda a, n, g, x, y: x > y,
        "Less": lambda a, n, g, x, y: x < y,
        "Equal": lambda a, n, g, x, y: x == y,
        "Neg": lambda a, n, g, x: -x,
        "Relu": lambda a, n, g, x: jnp.maximum(x, 0),
        "Reciprocal": lambda a, n, g, x: 1 / x,
        "Sqrt": lambda a, n, g, x: jnp.sqrt(x),
        "Rsqrt": lambda a, n, g, x: lax.rsqrt(x),
        "Exp": lambda a, n, g, x: jnp.exp(x),
        "Log": lambda a, n, g, x: jnp.log(x),
        "Tanh": lambda a, n, g, x: jnp.tanh(x),
        "Erf": lambda a, n, g, x: erf(x),
        "Sigmoid": lambda a, n, g, x: jax.nn.sigmoid(x),
        "Silu": lambda a, n, g, x: jax.nn.silu(x),
        "Clip": lambda a, n, g, x: jnp.clip(x, a.get("min", -np.inf), a.get("max", np.inf)),
        "LeakyRelu": lambda a, n, g, x: jnp.where(x >= 0, x, x * a.get("alpha", 0.01)),
        "HardSigmoid": lambda a, n, g, x: jnp.clip(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1),
        "HardSwish": lambda a, n, g, x: x * jnp.clip(x / 6 + 0.5, 0, 1),
        "BatchNorm": lambda a, n, g, x, s, b, m, v: (x - m) / jnp.sqrt(v + a.get("eps", 1e-5)) * s + b,
        "Gelu": lambda a, n, g, x: jax.nn.gelu(x, approximate=a.get("approximate", "none") == "tanh"),
        "Cast": lambda a, n, g, x: x.astype(np.dtype(a["to"])),
        "Where": lambda a, n, g, c, x, y: jnp.where(c, x, y),
        "BiasAdd": lambda a, n, g, x, b: x + b,
        "SwiGlu": lambda a, n, g, x, u: jax.nn.silu(x) * u,
        "ReduceSum": reduce(jnp.sum),
        "ReduceMean": reduce(jnp.mean),
        "ReduceMax": reduce(jnp.max),
        "Softmax": lambda a, n, g, x: jax.nn.softmax(x, axis=a.get("axis", -1)),
        "LayerNorm": lambda a, n, g, x, ga, be: ln(x, ga, be, a.get("eps", 1e-5), a.get("variance", "two_pass")),
        "RMSNorm": lambda a, n, g, x, ga: rms(x, ga, a.get("eps", 1e-6)),
        "AddLayerNorm": lambda a, n, g, x, y, ga, be: (ln(x + y, ga, be, a.get("eps", 1e-5), a.get("variance", "two_pass")), x + y),
        "AddRmsNorm": lambda a, n, g, x, y, ga: (rms(x + y, ga, a.get("eps", 1e-6)), x + y),
        "MatMul": lambda a, n, g, x, y, *b: jnp.matmul(x, y) + b[0] if b else jnp.matmul(x, y),
        "Reshape": lambda a, n, g, x: jnp.reshape(x, out_shape(n, g)),
        "Expand": lambda a, n, g, x: jnp.broadcast_to(x, out_shape(n, g)),
        "Transpose": lambda a, n, g, x: jnp.transpose(x, a.get("perm") or None),
        "Concat": lambda a, n, g, *xs: jnp.concatenate(xs, axis=a["axis"]),
        "Split": split,
        "Slice": lambda a, n, g, x: x[slice_index(a, x.shape)],
        "Conv": conv,
        "MaxPool": lambda a, n, g, x: pool(a, n, g, x, -np.inf, lax.max),
        "AveragePool": avg_pool,
        "Gather": gather,
        "Attention": attention,
    }


# ---- torch -----------------------------------------------------------------------------------
def _torch_rules() -> dict[str, Rule]:
    import torch
    import torch.nn.functional as F

    def dims(a: dict[str, Any], ndim: int) -> list[int]:
        return list(normalize_axes(a.get("axes"), ndim))

    def ln(x: Any, g: Any, b: Any, eps: float, mode: str) -> Any:
        mean = x.mean(dim=-1, keepdim=True)
        if mode == "one_pass":
            var = torch.clamp((x * x).mean(dim=-1, keepdim=True) - mean * mean, min=0)
        else:
            var = torch.square(x - mean).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * g + b

    def rms(x: Any, g: Any, eps: float) -> Any:
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * g

    def pad_spatial(x: Any, widths: Sequence[tuple[int, int]], value: float) -> Any:
        flat: list[int] = []
        for b, e in reversed(list(widths)):  # F.pad takes the last axis first
            flat += [b, e]
        return F.pad(x, flat, value=value) if any(flat) else x

    def conv(a: dict[str, Any], n: Node, g: Graph, x: Any, w: Any, *bias: Any) -> Any:
        spatial = x.ndim - 2
        strides, pads, dil = window_attrs(a, spatial)
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[spatial]
        group = int(a.get("group", 1))
        b = bias[0] if bias else None
        if list(pads[:spatial]) == list(pads[spatial:]):
            return fn(x, w, b, stride=tuple(strides), padding=tuple(pads[:spatial]), dilation=tuple(dil), groups=group)
        x = pad_spatial(x, [(pads[i], pads[spatial + i]) for i in range(spatial)], 0.0)
        return fn(x, w, b, stride=tuple(strides), dilation=tuple(dil), groups=group)

    def max_pool(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        kernel = tuple(a["kernel_shape"])
        widths, out, strides, dil = _window_geometry(n, g, kernel)
        spatial = len(kernel)
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[spatial]
        if all(b == e and 2 * b <= k for (b, e), k in zip(widths, kernel, strict=True)):
            y = fn(x, kernel, tuple(strides), tuple(b for b, _ in widths), tuple(dil))
        else:
            y = fn(pad_spatial(x, widths, float("-inf")), kernel, tuple(strides), 0, tuple(dil))
        return y[(slice(None), slice(None), *(slice(0, o) for o in out))]

    def avg_pool(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        kernel = tuple(a["kernel_shape"])
        widths, out, strides, dil = _window_geometry(n, g, kernel)
        if any(d != 1 for d in dil):
            raise Unsupported("AveragePool with dilations")
        fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[len(kernel)]
        xp = pad_spatial(x, widths, 0.0)
        size = float(np.prod(kernel))
        y = fn(xp, kernel, tuple(strides), 0) * size  # window sums
        y = y[(slice(None), slice(None), *(slice(0, o) for o in out))]
        return y / torch.from_numpy(_avg_pool_count(n, g))

    def cast(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        return x.to(getattr(torch, str(np.dtype(a["to"]))))

    def gather(a: dict[str, Any], n: Node, g: Graph, d: Any, i: Any) -> Any:
        axis = normalize_axis(a.get("axis", 0), d.ndim)
        i = torch.where(i < 0, i + d.shape[axis], i)
        flat = torch.index_select(d, axis, i.reshape(-1))
        return flat.reshape(*d.shape[:axis], *i.shape, *d.shape[axis + 1 :])

    def attention(a: dict[str, Any], n: Node, g: Graph, q: Any, k: Any, v: Any, *mask: Any) -> Any:
        s = torch.matmul(q, k.transpose(-1, -2)) * a.get("scale", 1.0)
        if mask:
            s = s + mask[0]
        return torch.matmul(torch.softmax(s, dim=-1), v)

    def out_shape(n: Node, g: Graph) -> tuple[int, ...]:
        return g.values[n.outputs[0]].shape

    def reduce_max(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        return torch.amax(x, dim=dims(a, x.ndim), keepdim=bool(a.get("keepdims", True)))

    def clip(a: dict[str, Any], n: Node, g: Graph, x: Any) -> Any:
        lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
        return torch.clamp(x, min=None if lo == -np.inf else lo, max=None if hi == np.inf else hi)

    return {
        "Add": lambda a, n, g, x, y: x + y,
        "Sub": lambda a, n, g, x, y: x - y,
        "Mul": lambda a, n, g, x, y: x * y,
        "Div": lambda a, n, g, x, y: x / y,
        "Maximum": lambda a, n, g, x, y: torch.maximum(x, y),
        "Minimum": lambda a, n, g, x, y: torch.minimum(x, y),
        "Pow": lambda a, n, g, x, y: torch.pow(x, y),
        "Greater": lambda a, n, g, x, y: x > y,
        "Less": lambda a, n, g, x, y: x < y,
        "Equal": lambda a, n, g, x, y: x == y,
        "Neg": lambda a, n, g, x: -x,
        "Relu": lambda a, n, g, x: torch.relu(x),
        "Reciprocal": lambda a, n, g, x: torch.reciprocal(x),
        "Sqrt": lambda a, n, g, x: torch.sqrt(x),
        "Rsqrt": lambda a, n, g, x: torch.rsqrt(x),
        "Exp": lambda a, n, g, x: torch.exp(x),
        "Log": lambda a, n, g, x: torch.log(x),
        "Tanh": lambda a, n, g, x: torch.tanh(x),
        "Erf": lambda a, n, g, x: torch.erf(x),
        "Sigmoid": lambda a, n, g, x: torch.sigmoid(x),
        "Silu": lambda a, n, g, x: F.silu(x),
        "Clip": clip,
        "LeakyRelu": lambda a, n, g, x: torch.where(x >= 0, x, x * a.get("alpha", 0.01)),
        "HardSigmoid": lambda a, n, g, x: torch.clamp(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1),
        "HardSwish": lambda a, n, g, x: x * torch.clamp(x / 6 + 0.5, 0, 1),
        "BatchNorm": lambda a, n, g, x, s, b, m, v: (x - m) / torch.sqrt(v + a.get("eps", 1e-5)) * s + b,
        "Gelu": lambda a, n, g, x: F.gelu(x, approximate="tanh" if a.get("approximate", "none") == "tanh" else "none"),
        "Cast": cast,
        "Where": lambda a, n, g, c, x, y: torch.where(c, x, y),
        "BiasAdd": lambda a, n, g, x, b: x + b,
        "SwiGlu": lambda a, n, g, x, u: F.silu(x) * u,
        "ReduceSum": lambda a, n, g, x: torch.sum(x, dim=dims(a, x.ndim), keepdim=bool(a.get("keepdims", True))),
        "ReduceMean": lambda a, n, g, x: torch.mean(x, dim=dims(a, x.ndim), keepdim=bool(a.get("keepdims", True))),
        "ReduceMax": reduce_max,
        "Softmax": lambda a, n, g, x: torch.softmax(x, dim=a.get("axis", -1)),
        "LayerNorm": lambda a, n, g, x, ga, be: ln(x, ga, be, a.get("eps", 1e-5), a.get("variance", "two_pass")),
        "RMSNorm": lambda a, n, g, x, ga: rms(x, ga, a.get("eps", 1e-6)),
        "AddLayerNorm": lambda a, n, g, x, y, ga, be: (ln(x + y, ga, be, a.get("eps", 1e-5), a.get("variance", "two_pass")), x + y),
        "AddRmsNorm": lambda a, n, g, x, y, ga: (rms(x + y, ga, a.get("eps", 1e-6)), x + y),
        "MatMul": lambda a, n, g, x, y, *b: torch.matmul(x, y) + b[0] if b else torch.matmul(x, y),
        "Reshape": lambda a, n, g, x: torch.reshape(x, out_shape(n, g)),
        "Expand": lambda a, n, g, x: x.expand(out_shape(n, g)),
        "Transpose": lambda a, n, g, x: x.permute(*(a.get("perm") or tuple(reversed(range(x.ndim))))),
        "Concat": lambda a, n, g, *xs: torch.cat(xs, dim=a["axis"]),
        "Split": lambda a, n, g, x: tuple(torch.split(x, list(a["sizes"]), dim=a["axis"])),
        "Slice": lambda a, n, g, x: x[slice_index(a, tuple(x.shape))],
        "Conv": conv,
        "MaxPool": max_pool,
        "AveragePool": avg_pool,
        "Gather": gather,
        "Attention": attention,
    }


# ---- the walk --------------------------------------------------------------------------------
def _walk(graph: Graph, rules: Mapping[str, Rule], env: dict[str, Any]) -> tuple[Any, ...]:
    for node in graph.nodes:
        rule = rules.get(node.op)
        if rule is None:
            raise Unsupported(f"no rule for {node.op} (node {node.name})")
        args = [env[i] for i in node.inputs]
        outs = rule(_attrs(node), node, graph, *args)
        if len(node.outputs) == 1:
            env[node.outputs[0]] = outs[0] if isinstance(outs, tuple) else outs
        else:
            for name, val in zip(node.outputs, outs, strict=True):
                env[name] = val
    return tuple(env[o] for o in graph.outputs)


def check_supported(graph: Graph, backend: str) -> None:
    """Raise :class:`Unsupported` naming the first op of ``graph`` that ``backend`` cannot lower."""
    rules = _jax_rules() if backend == "jax" else _torch_rules()
    missing = sorted({n.op for n in graph.nodes if n.op not in rules})
    if missing:
        raise Unsupported(f"{backend} lowering has no rule for {', '.join(missing)}")


def lower_jax(graph: Graph) -> Callable[..., tuple[Any, ...]]:
    """``jax.jit`` of the whole graph: ``fn(*inputs in graph.inputs order) -> outputs``.

    Constants are closed over (XLA sees them, as onnxruntime and fusiontune see initializers).
    """
    import jax
    import jax.numpy as jnp

    check_supported(graph, "jax")
    rules = _jax_rules()
    consts = {k: jnp.asarray(v) for k, v in graph.constants.items()}

    def fn(*xs: Any) -> tuple[Any, ...]:
        env: dict[str, Any] = dict(consts)
        env.update(zip(graph.inputs, xs, strict=True))
        return _walk(graph, rules, env)

    return jax.jit(fn)


def lower_torch(graph: Graph, compile: bool = True) -> Callable[..., tuple[Any, ...]]:
    """``torch.compile`` (default inductor) of the whole graph over torch tensors."""
    import torch

    check_supported(graph, "torch")
    # Dynamo caches compiled frames by code object, and every lowered graph runs the same `fn`:
    # after 8 graphs it would stop compiling and run eagerly. A fresh cache per graph keeps every
    # case compiled (the previous case's function is not called again).
    torch._dynamo.reset()
    rules = _torch_rules()
    consts = {k: torch.from_numpy(np.array(v)) for k, v in graph.constants.items()}

    def fn(*xs: Any) -> tuple[Any, ...]:
        env: dict[str, Any] = dict(consts)
        env.update(zip(graph.inputs, xs, strict=True))
        return _walk(graph, rules, env)

    return torch.compile(fn) if compile else fn


# ---- numexpr ---------------------------------------------------------------------------------
_NE_BINARY = {"Add": "({} + {})", "Sub": "({} - {})", "Mul": "({} * {})", "Div": "({} / {})", "Pow": "({} ** {})",
              "Maximum": "where({0} > {1}, {0}, {1})", "Minimum": "where({0} < {1}, {0}, {1})"}
_NE_UNARY = {"Neg": "(-{})", "Exp": "exp({})", "Log": "log({})", "Tanh": "tanh({})", "Sqrt": "sqrt({})",
             "Relu": "where({0} > 0, {0}, 0)", "Reciprocal": "(1 / {})", "Sigmoid": "(1 / (1 + exp(-{})))"}


def numexpr_expression(graph: Graph) -> tuple[str, dict[str, np.ndarray]] | None:
    """The single output of an all-elementwise graph as one numexpr expression.

    Returns:
        ``(expression, constants)``: the expression names the graph inputs by ``v0, v1, ...`` in
        order and array constants by ``c0, c1, ...`` (returned); scalar constants are inlined as
        float32 variables too (numexpr would compute a Python float literal in float64).
        None when the graph has several outputs or an op numexpr has no form for.
    """
    if len(graph.outputs) != 1:
        return None
    names: dict[str, str] = {name: f"v{i}" for i, name in enumerate(graph.inputs)}
    consts: dict[str, np.ndarray] = {}
    for i, (name, arr) in enumerate(graph.constants.items()):
        names[name] = f"c{i}"
        consts[f"c{i}"] = np.asarray(arr).reshape(()) if arr.size == 1 else np.asarray(arr)
    expr: dict[str, str] = dict(names)
    for node in graph.nodes:
        args = [expr[i] for i in node.inputs]
        if node.op in ("Reshape", "Expand") and graph.values[node.outputs[0]].shape == graph.values[node.inputs[0]].shape:
            text = args[0]  # a no-op (the importer writes Identity as a same-shape Reshape)
        elif node.op in _NE_BINARY and len(args) == 2:
            text = _NE_BINARY[node.op].format(*args)
        elif node.op in _NE_UNARY and len(args) == 1:
            text = _NE_UNARY[node.op].format(*args)
        else:
            return None
        expr[node.outputs[0]] = text
    return expr[graph.outputs[0]], consts
