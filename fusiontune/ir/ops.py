"""The op catalogue: for every op, its kind, attributes, shape rule and numpy reference.

The reference functions *define* the ops: the interpreter runs them, and every generated kernel is
checked against them. Each reference computes in the dtype of its inputs, so the same function
serves the float64 reference run and the float32 "unfused" run.

Kinds follow DESIGN section 3: ``elementwise`` (numpy broadcasting), ``reduction`` (reductions and
the row-wise normalizations built on them), ``contraction`` (MatMul, Conv), ``window`` (MaxPool,
AveragePool: a reduction over a sliding window), ``attention`` (the fused Attention op that
FlashAttentionFusionPass makes), ``layout`` (data movement, Gather), ``opaque`` (a fused op with a
kernel of its own that fuses with nothing else: RotaryPositionEmbedding).

The CNN ops follow ONNX's definitions (NCHW, explicit ``pads`` as ``[begin..., end...]``); the ONNX
importer (ir/onnx_import.py) resolves ``auto_pad`` and moves constant inputs into attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from fusiontune.ir.graph import Node, Shape, Value

ShapeRule = Callable[[Mapping[str, Any], Sequence[Value]], list[tuple[Shape, str]]]
Reference = Callable[..., tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class OpDef:
    """Everything the toolchain knows about one op.

    Attributes:
        name: op name as it appears in graphs and fusion logs.
        kind: elementwise | reduction | contraction | layout.
        infer: shape rule, ``(attrs, input values) -> [(shape, dtype), ...]`` per output.
        reference: numpy definition, ``(attrs, *arrays) -> tuple of arrays``.
        arity: number of inputs, or a ``(min, max)`` range; ``None`` for variadic.
        attrs: attribute names with their defaults.
        basic: taken by basic (elementwise-chain) fusion. Expensive elementwise ops (Pow, the
            transcendentals) join fused groups only at the composite stage, as Pow does in
            MindSpore's NetCompositeFuse example (seed 001).
        doc: one line for ``fusiontune passes``-style listings and dumps.
    """

    name: str
    kind: str
    infer: ShapeRule
    reference: Reference
    arity: int | tuple[int, int] | None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    basic: bool = False
    doc: str = ""

    def check_arity(self, n: int) -> bool:
        if self.arity is None:
            return n >= 1
        if isinstance(self.arity, tuple):
            return self.arity[0] <= n <= self.arity[1]
        return n == self.arity


CATALOGUE: dict[str, OpDef] = {}


def _register(op: OpDef) -> OpDef:
    CATALOGUE[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


# ---- shape helpers ---------------------------------------------------------------------------
FLOAT_DTYPES = ("float64", "float32", "float16")


def broadcast_shapes(*shapes: Shape) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {list(shapes)} do not broadcast") from None


def result_dtype(values: Sequence[Value]) -> str:
    """numpy-style promotion among the float inputs; ints only when all inputs are ints."""
    floats = [v.dtype for v in values if v.dtype in FLOAT_DTYPES]
    if floats:
        return min(floats, key=FLOAT_DTYPES.index)
    return values[0].dtype


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted({normalize_axis(a, rank) for a in axes}))


def _same(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    return [(ins[0].shape, ins[0].dtype)]


def _broadcast(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    return [(broadcast_shapes(*(v.shape for v in ins)), result_dtype(ins))]


def _compare(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    return [(broadcast_shapes(*(v.shape for v in ins)), "bool")]


def _where(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    return [(broadcast_shapes(*(v.shape for v in ins)), result_dtype(ins[1:]))]


def _cast(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    return [(ins[0].shape, str(np.dtype(attrs["to"])))]


def _reduce(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    shape = ins[0].shape
    axes = normalize_axes(attrs.get("axes"), len(shape))
    if attrs.get("keepdims", True):
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return [(out, ins[0].dtype)]


def _norm(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x = ins[0]
    n = x.shape[-1]
    if attrs.get("variance", "two_pass") not in VARIANCE_MODES:
        raise ValueError(f"variance must be one of {VARIANCE_MODES}, got {attrs['variance']!r}")
    for p in ins[1:]:
        if p.shape not in ((n,), (1, n)) and broadcast_shapes(p.shape, x.shape) != x.shape:
            raise ValueError(f"parameter shape {p.shape} does not fit normalized shape {x.shape}")
    return [(x.shape, x.dtype), *_saved_stats(attrs, x, len(ins) - 1)]


def _saved_stats(attrs: Mapping[str, Any], x: Value, params: int) -> list[tuple[Shape, str]]:
    """The extra outputs of a normalization with ``save_stats=1``: per-row (mean, rstd) of a
    LayerNorm (two parameters), rstd of an RMSNorm (one), shaped ``(..., 1)``."""
    if not attrs.get("save_stats", 0):
        return []
    row = (*x.shape[:-1], 1)
    return [(row, x.dtype)] * (2 if params == 2 else 1)


def _add_norm(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    shape = broadcast_shapes(ins[0].shape, ins[1].shape)
    dtype = result_dtype(ins[:2])
    y, *stats = _norm(attrs, [Value("s", shape, dtype), *ins[2:]])
    return [y, (shape, dtype), *stats]


def matmul_operand_shape(shape: Shape, transposed: Any) -> Shape:
    """The shape MatMul multiplies: ``shape`` with its last two axes swapped when ``transposed``."""
    shape = tuple(shape)
    return (*shape[:-2], shape[-1], shape[-2]) if transposed and len(shape) >= 2 else shape


def _matmul(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    a, b = ins[0].shape, ins[1].shape
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"MatMul needs rank >= 2 operands, got {a} and {b}")
    a = matmul_operand_shape(a, attrs.get("trans_a", 0))
    b = matmul_operand_shape(b, attrs.get("trans_b", 0))
    if a[-1] != b[-2]:
        raise ValueError(f"MatMul inner dimensions differ: {a} @ {b}")
    batch = broadcast_shapes(a[:-2], b[:-2])
    out = (*batch, a[-2], b[-1])
    if len(ins) == 3:
        if broadcast_shapes(out, ins[2].shape) != out:
            raise ValueError(f"MatMul bias {ins[2].shape} does not broadcast to {out}")
    return [(out, result_dtype(ins[:2]))]


def _bias_add(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x, b = ins
    if b.shape != (x.shape[-1],):
        raise ValueError(f"BiasAdd bias must have shape ({x.shape[-1]},), got {b.shape}")
    return [(x.shape, result_dtype(ins))]


def _reshape(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    target = list(attrs["shape"])
    src = ins[0].shape
    for i, d in enumerate(target):
        if d == 0:
            target[i] = src[i]
    if target.count(-1) > 1:
        raise ValueError("Reshape allows at most one -1")
    size = int(np.prod(src, dtype=np.int64))
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        target[target.index(-1)] = size // known if known else 0
    if int(np.prod(target, dtype=np.int64)) != size:
        raise ValueError(f"cannot reshape {src} to {tuple(attrs['shape'])}")
    return [(tuple(int(d) for d in target), ins[0].dtype)]


def _transpose(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    shape = ins[0].shape
    perm = attrs.get("perm") or tuple(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"bad permutation {perm} for rank {len(shape)}")
    return [(tuple(shape[p] for p in perm), ins[0].dtype)]


def _concat(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    rank = len(ins[0].shape)
    axis = normalize_axis(attrs["axis"], rank)
    for v in ins[1:]:
        if len(v.shape) != rank or any(
            d != e for i, (d, e) in enumerate(zip(v.shape, ins[0].shape, strict=True)) if i != axis
        ):
            raise ValueError(f"Concat inputs {[v.shape for v in ins]} differ off axis {axis}")
    out = list(ins[0].shape)
    out[axis] = sum(v.shape[axis] for v in ins)
    return [(tuple(out), result_dtype(ins))]


def _split(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    shape = ins[0].shape
    axis = normalize_axis(attrs["axis"], len(shape))
    sizes = attrs["sizes"]
    if sum(sizes) != shape[axis]:
        raise ValueError(f"Split sizes {sizes} do not add up to {shape[axis]}")
    return [
        (tuple(s if i == axis else d for i, d in enumerate(shape)), ins[0].dtype) for s in sizes
    ]


def slice_index(attrs: Mapping[str, Any], shape: Shape) -> tuple[slice, ...]:
    """The numpy index a Slice node takes (ONNX semantics, clamped)."""
    index = [slice(None)] * len(shape)
    axes = attrs.get("axes") or tuple(range(len(attrs["starts"])))
    steps = attrs.get("steps") or (1,) * len(axes)
    for start, end, axis, step in zip(attrs["starts"], attrs["ends"], axes, steps, strict=True):
        index[normalize_axis(axis, len(shape))] = slice(start, end, step)
    return tuple(index)


def _slice(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    probe = np.empty(ins[0].shape, dtype=np.bool_)[slice_index(attrs, ins[0].shape)]
    return [(tuple(probe.shape), ins[0].dtype)]


def _expand(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    return [(broadcast_shapes(ins[0].shape, tuple(attrs["shape"])), ins[0].dtype)]


def _spatial_out(size: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int, ceil: bool = False) -> int:
    """Output length of a sliding window along one spatial axis (ONNX Conv / Pool)."""
    span = dilation * (k - 1) + 1
    num = size + pad_begin + pad_end - span
    if num < 0:
        raise ValueError(f"window {span} is larger than the padded input {size + pad_begin + pad_end}")
    out = (-(-num // stride) if ceil else num // stride) + 1
    if ceil and (out - 1) * stride >= size + pad_begin:
        out -= 1  # the last window would start inside the end padding only (ONNX / onnxruntime rule)
    return out


def window_attrs(attrs: Mapping[str, Any], spatial: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(strides, pads, dilations)`` with ONNX defaults filled in for ``spatial`` axes."""
    strides = tuple(attrs.get("strides") or (1,) * spatial)
    pads = tuple(attrs.get("pads") or (0,) * (2 * spatial))
    dilations = tuple(attrs.get("dilations") or (1,) * spatial)
    if len(strides) != spatial or len(pads) != 2 * spatial or len(dilations) != spatial:
        raise ValueError(f"strides {strides}, pads {pads}, dilations {dilations} do not fit {spatial} spatial axes")
    return strides, pads, dilations


def _conv(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x, w = ins[0].shape, ins[1].shape
    if len(x) < 3 or len(w) != len(x):
        raise ValueError(f"Conv needs X (N, C, spatial...) and W of the same rank, got {x} and {w}")
    group = int(attrs.get("group", 1))
    if x[1] != w[1] * group or w[0] % group:
        raise ValueError(f"Conv channels: X {x}, W {w}, group {group}")
    if len(ins) == 3 and ins[2].shape != (w[0],):
        raise ValueError(f"Conv bias must have shape ({w[0]},), got {ins[2].shape}")
    spatial = len(x) - 2
    strides, pads, dil = window_attrs(attrs, spatial)
    out = [x[0], w[0]]
    for i in range(spatial):
        out.append(_spatial_out(x[2 + i], w[2 + i], strides[i], pads[i], pads[spatial + i], dil[i]))
    return [(tuple(out), result_dtype(ins[:2]))]


def _pool(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x = ins[0].shape
    kernel = tuple(attrs["kernel_shape"])
    spatial = len(x) - 2
    if spatial < 1 or len(kernel) != spatial:
        raise ValueError(f"kernel_shape {kernel} does not fit input {x}")
    strides, pads, dil = window_attrs(attrs, spatial)
    ceil = bool(attrs.get("ceil_mode", 0))
    out = list(x[:2])
    for i in range(spatial):
        out.append(_spatial_out(x[2 + i], kernel[i], strides[i], pads[i], pads[spatial + i], dil[i], ceil))
    return [(tuple(out), ins[0].dtype)]


def _gather(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    data, idx = ins
    if not idx.dtype.startswith("int"):
        raise ValueError(f"Gather indices must be integers, got {idx.dtype}")
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape))
    return [(data.shape[:axis] + idx.shape + data.shape[axis + 1 :], data.dtype)]


def _attention(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    q, k, v = (x.shape for x in ins[:3])
    if len(q) < 2 or len(k) != len(q) or len(v) != len(q):
        raise ValueError(f"Attention needs q, k, v of one rank >= 2, got {q}, {k}, {v}")
    if q[-1] != k[-1] or k[-2] != v[-2]:
        raise ValueError(f"Attention shapes: q {q}, k {k}, v {v} (k is (..., Sk, D), v is (..., Sk, Dv))")
    batch = broadcast_shapes(q[:-2], k[:-2], v[:-2])
    out = (*batch, q[-2], v[-1])
    if len(ins) == 4:
        scores = (*batch, q[-2], k[-2])
        if broadcast_shapes(scores, ins[3].shape) != scores:
            raise ValueError(f"Attention mask {ins[3].shape} does not broadcast to the scores {scores}")
    return [(out, result_dtype(ins[:3]))]


# ---- references ------------------------------------------------------------------------------
def _ew(fn: Callable[..., np.ndarray]) -> Reference:
    def ref(attrs: Mapping[str, Any], *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        out = np.asarray(fn(*xs))
        dtypes = [x.dtype for x in xs if np.issubdtype(x.dtype, np.floating)]
        if dtypes and np.issubdtype(out.dtype, np.floating):
            out = out.astype(np.result_type(*dtypes), copy=False)
        return (out,)

    return ref


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + x.dtype.type(0.044715) * x * x * x)))
    return 0.5 * x * (1.0 + special.erf(x * x.dtype.type(1.0 / np.sqrt(2.0))))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _reduce_ref(fn: Callable[..., np.ndarray]) -> Reference:
    def ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, ...]:
        axes = normalize_axes(attrs.get("axes"), x.ndim)
        return (fn(x, axis=axes, keepdims=bool(attrs.get("keepdims", True))).astype(x.dtype),)

    return ref


def _softmax(attrs: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, ...]:
    axis = attrs.get("axis", -1)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True),)


VARIANCE_MODES = ("two_pass", "one_pass")
"""LayerNorm's ``variance`` attribute: ``E[(x - mean)^2]`` (two sweeps) or ``E[x^2] - mean^2``."""


def _variance(x: np.ndarray, mean: np.ndarray, mode: str) -> np.ndarray:
    """The row variance over the last axis, computed as ``mode`` says, in x's dtype.

    ``"one_pass"`` is ``max(E[x^2] - E[x]^2, 0)``: both means come from one sweep over x, and the
    clamp keeps a cancellation that goes below zero from turning into a NaN under the square root.
    """
    if mode == "one_pass":
        msq = np.square(x).mean(axis=-1, keepdims=True)
        return np.maximum(msq - mean * mean, x.dtype.type(0))
    if mode != "two_pass":
        raise ValueError(f"variance must be one of {VARIANCE_MODES}, got {mode!r}")
    return np.square(x - mean).mean(axis=-1, keepdims=True)


def _layer_norm_core(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, variance: str = "two_pass"
) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = _variance(x, mean, variance)
    return (x - mean) / np.sqrt(var + x.dtype.type(eps)) * gamma + beta


def _rms_norm_core(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    ms = np.square(x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(ms + x.dtype.type(eps)) * gamma


def layer_norm_stats(x: np.ndarray, eps: float, variance: str = "two_pass") -> tuple[np.ndarray, np.ndarray]:
    """LayerNorm's per-row ``(mean, rstd)`` over the last axis, ``rstd = 1 / sqrt(var + eps)``."""
    mean = x.mean(axis=-1, keepdims=True)
    return mean, (1.0 / np.sqrt(_variance(x, mean, variance) + x.dtype.type(eps))).astype(x.dtype)


def rms_norm_rstd(x: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm's per-row ``1 / sqrt(mean(x^2) + eps)`` over the last axis."""
    return (1.0 / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))).astype(x.dtype)


def _layer_norm_stats_out(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    if not attrs.get("save_stats", 0):
        return ()
    return layer_norm_stats(x, attrs.get("eps", 1e-5), attrs.get("variance", "two_pass"))


def _rms_norm_stats_out(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    return (rms_norm_rstd(x, attrs.get("eps", 1e-6)),) if attrs.get("save_stats", 0) else ()


def _layer_norm(attrs: Mapping[str, Any], x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple:
    y = _layer_norm_core(x, g, b, attrs.get("eps", 1e-5), attrs.get("variance", "two_pass"))
    return (y, *_layer_norm_stats_out(attrs, x))


def _rms_norm(attrs: Mapping[str, Any], x: np.ndarray, g: np.ndarray) -> tuple:
    return (_rms_norm_core(x, g, attrs.get("eps", 1e-6)), *_rms_norm_stats_out(attrs, x))


def _add_layer_norm(attrs: Mapping[str, Any], a: np.ndarray, b: np.ndarray, g: np.ndarray, beta: np.ndarray) -> tuple:
    s = a + b
    y = _layer_norm_core(s, g, beta, attrs.get("eps", 1e-5), attrs.get("variance", "two_pass"))
    return (y, s, *_layer_norm_stats_out(attrs, s))


def _add_rms_norm(attrs: Mapping[str, Any], a: np.ndarray, b: np.ndarray, g: np.ndarray) -> tuple:
    s = a + b
    return (_rms_norm_core(s, g, attrs.get("eps", 1e-6)), s, *_rms_norm_stats_out(attrs, s))


def _matmul_ref(attrs: Mapping[str, Any], a: np.ndarray, b: np.ndarray, *bias: np.ndarray) -> tuple:
    if attrs.get("trans_a", 0):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("trans_b", 0):
        b = np.swapaxes(b, -1, -2)
    out = np.matmul(a, b)
    if bias:
        out = out + bias[0]
    return (out.astype(np.result_type(a.dtype, b.dtype), copy=False),)


def _split_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return tuple(np.ascontiguousarray(p) for p in np.split(x, cuts, axis=attrs["axis"]))


def _reshape_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    shape = _reshape(attrs, [Value("x", x.shape, str(x.dtype))])[0][0]
    return (x.reshape(shape),)


def _transpose_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    return (np.transpose(x, attrs.get("perm") or None),)


def _windows(x: np.ndarray, kernel: Sequence[int], attrs: Mapping[str, Any], fill: float, ceil: bool = False) -> np.ndarray:
    """``x`` (N, C, spatial...) padded with ``fill`` and cut into windows:
    shape (N, C, out spatial..., kernel...), a strided view (ONNX Conv / Pool indexing)."""
    spatial = x.ndim - 2
    strides, pads, dil = window_attrs(attrs, spatial)
    outs = [_spatial_out(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[spatial + i], dil[i], ceil) for i in range(spatial)]
    widths = [(0, 0), (0, 0)]
    for i in range(spatial):
        span = dil[i] * (kernel[i] - 1) + 1
        need = (outs[i] - 1) * strides[i] + span  # the padded length every window fits in
        widths.append((pads[i], max(need - x.shape[2 + i] - pads[i], 0)))
    xp = np.pad(x, widths, constant_values=fill)
    spans = [dil[i] * (kernel[i] - 1) + 1 for i in range(spatial)]
    win = np.lib.stride_tricks.sliding_window_view(xp, spans, axis=tuple(range(2, 2 + spatial)))
    index = (slice(None), slice(None))
    index += tuple(slice(0, outs[i] * strides[i], strides[i]) for i in range(spatial))
    index += tuple(slice(None, None, dil[i]) for i in range(spatial))
    return win[index]


def _conv_ref(attrs: Mapping[str, Any], x: np.ndarray, w: np.ndarray, *bias: np.ndarray) -> tuple:
    group = int(attrs.get("group", 1))
    spatial = x.ndim - 2
    win = _windows(x, w.shape[2:], attrs, 0.0)  # (N, C, out..., k...)
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    out_sp = win.shape[2 : 2 + spatial]
    outs = []
    letters = "hijk"[:spatial]
    kl = "pqrs"[:spatial]
    spec = f"nc{letters}{kl},mc{kl}->nm{letters}"
    for g in range(group):
        outs.append(np.einsum(spec, win[:, g * cg : (g + 1) * cg], w[g * mg : (g + 1) * mg], optimize=True))
    out = np.concatenate(outs, axis=1) if group > 1 else outs[0]
    if bias:
        out = out + bias[0].reshape((m,) + (1,) * spatial)
    assert out.shape == (n, m, *out_sp)
    return (out.astype(np.result_type(x.dtype, w.dtype), copy=False),)


def _max_pool_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    kernel = tuple(attrs["kernel_shape"])
    win = _windows(x, kernel, attrs, -np.inf, bool(attrs.get("ceil_mode", 0)))
    axes = tuple(range(x.ndim, win.ndim))
    return (win.max(axis=axes).astype(x.dtype),)


def avg_pool_count(attrs: Mapping[str, Any], spatial_shape: Shape, dtype: Any = np.float64) -> np.ndarray:
    """AveragePool's divisor per window, shaped (1, 1, out spatial...): ``count_include_pad=1``
    counts the window clipped to the explicitly padded input (a ceil_mode overhang never counts),
    0 the real elements only."""
    kernel = tuple(attrs["kernel_shape"])
    ceil = bool(attrs.get("ceil_mode", 0))
    spatial = len(spatial_shape)
    strides, pads, dil = window_attrs(attrs, spatial)
    ones = np.ones((1, 1, *spatial_shape), dtype)
    axes = tuple(range(2 + spatial, 2 + 2 * spatial))
    real = _windows(ones, kernel, attrs, 0.0, ceil).sum(axis=axes)
    if not attrs.get("count_include_pad", 0):
        return real
    padded = np.pad(ones, [(0, 0), (0, 0)] + [(pads[i], pads[spatial + i]) for i in range(spatial)], constant_values=1)
    shifted = {**attrs, "pads": (0,) * (2 * spatial)}
    count = _windows(padded, kernel, shifted, 0.0, ceil)
    # `padded` starts at the explicit begin pad, so its windows line up with those of x; without
    # pads its ceil_mode rule may allow one more window than x's (that window starts in x's end
    # padding only), so keep x's windows.
    return count.sum(axis=axes)[(slice(None), slice(None), *(slice(0, n) for n in real.shape[2:]))]


def _avg_pool_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    """Mean over each window, divided by :func:`avg_pool_count`."""
    kernel = tuple(attrs["kernel_shape"])
    win = _windows(x, kernel, attrs, 0.0, bool(attrs.get("ceil_mode", 0)))
    total = win.sum(axis=tuple(range(x.ndim, win.ndim)))
    return ((total / avg_pool_count(attrs, x.shape[2:], x.dtype)).astype(x.dtype),)


def _gather_ref(attrs: Mapping[str, Any], data: np.ndarray, idx: np.ndarray) -> tuple:
    axis = normalize_axis(attrs.get("axis", 0), data.ndim)
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"Gather index out of range [-{n}, {n})")
    return (np.take(data, np.where(idx < 0, idx + n, idx), axis=axis),)


def _attention_ref(attrs: Mapping[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, *mask: np.ndarray) -> tuple:
    """``softmax(q @ k^T * scale + mask) @ v``; ``kv_block`` is a schedule hint and changes nothing here."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(attrs.get("scale", 1.0))
    if mask:
        s = s + mask[0]
    (p,) = _softmax({"axis": -1}, s)
    return (np.matmul(p, v).astype(np.result_type(q.dtype, k.dtype, v.dtype), copy=False),)


def _batch_norm_ref(attrs: Mapping[str, Any], x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray) -> tuple:
    eps = x.dtype.type(attrs.get("eps", 1e-5))
    return ((x - mean) / np.sqrt(var + eps) * scale + bias,)


def _batch_norm(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x = ins[0]
    for p in ins[1:]:
        if len(x.shape) < 2 or p.shape not in ((x.shape[1],) + (1,) * (len(x.shape) - 2),):
            raise ValueError(
                f"BatchNorm parameters must have shape (C, 1, ...) = {(x.shape[1],) + (1,) * (len(x.shape) - 2)} "
                f"for input {x.shape}, got {p.shape}"
            )
    return [(x.shape, result_dtype(ins))]


# ---- the catalogue ---------------------------------------------------------------------------
def _binary(name: str, fn: Callable[..., np.ndarray], basic: bool, doc: str) -> None:
    _register(OpDef(name, "elementwise", _broadcast, _ew(fn), 2, basic=basic, doc=doc))


def _unary(name: str, fn: Callable[..., np.ndarray], basic: bool, doc: str, **attrs: Any) -> None:
    _register(OpDef(name, "elementwise", _same, _ew(fn), 1, attrs=attrs, basic=basic, doc=doc))


_binary("Add", np.add, True, "a + b")
_binary("Sub", np.subtract, True, "a - b")
_binary("Mul", np.multiply, True, "a * b")
_binary("Div", np.divide, True, "a / b")
_binary("Maximum", np.maximum, True, "max(a, b)")
_binary("Minimum", np.minimum, True, "min(a, b)")
_binary("Pow", np.power, False, "a ** b")
_register(OpDef("Greater", "elementwise", _compare, _ew(np.greater), 2, basic=True, doc="a > b"))
_register(OpDef("Less", "elementwise", _compare, _ew(np.less), 2, basic=True, doc="a < b"))
_register(OpDef("Equal", "elementwise", _compare, _ew(np.equal), 2, basic=True, doc="a == b"))
_unary("Neg", np.negative, True, "-x")
_unary("Relu", lambda x: np.maximum(x, x.dtype.type(0)), True, "max(x, 0)")
_unary("Reciprocal", lambda x: 1.0 / x, True, "1 / x")
_unary("Sqrt", np.sqrt, False, "sqrt(x)")
_unary("Rsqrt", lambda x: 1.0 / np.sqrt(x), False, "1 / sqrt(x)")
_unary("Exp", np.exp, False, "e ** x")
_unary("Log", np.log, False, "ln x")
_unary("Tanh", np.tanh, False, "tanh x")
_unary("Erf", special.erf, False, "the error function")
_unary("Sigmoid", _sigmoid, False, "1 / (1 + e ** -x)")
_unary("Silu", lambda x: x * _sigmoid(x), False, "x * sigmoid(x)")
_register(
    OpDef(
        "Clip", "elementwise", _same,
        lambda attrs, x: (np.clip(x, x.dtype.type(attrs.get("min", -np.inf)), x.dtype.type(attrs.get("max", np.inf))).astype(x.dtype),),
        1, attrs={"min": float("-inf"), "max": float("inf")}, basic=True, doc="min(max(x, min), max)",
    )
)
_register(
    OpDef(
        "LeakyRelu", "elementwise", _same,
        lambda attrs, x: (np.where(x >= 0, x, x * x.dtype.type(attrs.get("alpha", 0.01))).astype(x.dtype),),
        1, attrs={"alpha": 0.01}, basic=True, doc="x if x >= 0 else alpha * x",
    )
)
_register(
    OpDef(
        "HardSigmoid", "elementwise", _same,
        lambda attrs, x: (np.clip(x * x.dtype.type(attrs.get("alpha", 0.2)) + x.dtype.type(attrs.get("beta", 0.5)), 0, 1).astype(x.dtype),),
        1, attrs={"alpha": 0.2, "beta": 0.5}, basic=True, doc="max(0, min(1, alpha * x + beta))",
    )
)
_register(
    OpDef(
        "HardSwish", "elementwise", _same,
        lambda attrs, x: ((x * np.clip(x * x.dtype.type(1.0 / 6.0) + x.dtype.type(0.5), 0, 1)).astype(x.dtype),),
        1, basic=True, doc="x * max(0, min(1, x / 6 + 1 / 2))",
    )
)
_register(
    OpDef(
        "BatchNorm", "elementwise", _batch_norm, _batch_norm_ref, 5, attrs={"eps": 1e-5},
        doc="inference BatchNormalization: (x - mean) / sqrt(var + eps) * scale + bias, "
        "parameters shaped (C, 1, ...) against x (N, C, ...)",
    )
)
_register(
    OpDef(
        "Gelu",
        "elementwise",
        _same,
        lambda attrs, x: _ew(lambda v: _gelu(v, attrs.get("approximate", "none")))(attrs, x),
        1,
        attrs={"approximate": "none"},
        doc="x * Phi(x); approximate='tanh' is the tanh form",
    )
)
_register(
    OpDef(
        "Cast",
        "elementwise",
        _cast,
        lambda attrs, x: (x.astype(np.dtype(attrs["to"])),),
        1,
        attrs={"to": "float32"},
        basic=True,
        doc="convert the element type",
    )
)
_register(
    OpDef(
        "Where",
        "elementwise",
        _where,
        lambda attrs, c, a, b: (np.asarray(np.where(c, a, b)).astype(np.result_type(a.dtype, b.dtype)),),
        3,
        basic=True,
        doc="cond ? a : b",
    )
)
_register(
    OpDef("BiasAdd", "elementwise", _bias_add, _ew(np.add), 2, basic=True, doc="x + bias over the last axis")
)
_register(
    OpDef(
        "SwiGlu",
        "elementwise",
        _broadcast,
        _ew(lambda g, u: g * _sigmoid(g) * u),
        2,
        doc="silu(gate) * up",
    )
)
_register(
    OpDef(
        "GeGlu",
        "elementwise",
        _broadcast,
        lambda attrs, g, u: _ew(lambda a, b: _gelu(a, attrs.get("approximate", "none")) * b)(
            attrs, g, u
        ),
        2,
        attrs={"approximate": "none"},
        doc="gelu(gate) * up; approximate='tanh' gates with the tanh GELU",
    )
)
for _name, _fn, _doc in (
    ("ReduceSum", np.sum, "sum over axes"),
    ("ReduceMean", np.mean, "mean over axes"),
    ("ReduceMax", np.max, "max over axes"),
):
    _register(
        OpDef(_name, "reduction", _reduce, _reduce_ref(_fn), 1, attrs={"axes": None, "keepdims": True}, doc=_doc)
    )
_register(OpDef("Softmax", "reduction", _same, _softmax, 1, attrs={"axis": -1}, doc="exp(x - max) / sum"))
_register(
    OpDef(
        "LayerNorm", "reduction", _norm, _layer_norm, 3,
        attrs={"eps": 1e-5, "variance": "two_pass", "save_stats": 0},
        doc="(x - mean) / sqrt(var + eps) * gamma + beta over the last axis; "
        "variance='one_pass' takes var as max(E[x^2] - mean^2, 0); save_stats=1 also "
        "outputs the per-row mean and rstd (for LayerNormGrad)",
    )
)
_register(
    OpDef(
        "RMSNorm", "reduction", _norm, _rms_norm, 2, attrs={"eps": 1e-6, "save_stats": 0},
        doc="x / sqrt(mean(x^2) + eps) * gamma over the last axis; save_stats=1 also outputs "
        "the per-row rstd (for RmsNormGrad)",
    )
)
_register(
    OpDef(
        "AddLayerNorm", "reduction", _add_norm, _add_layer_norm, 4,
        attrs={"eps": 1e-5, "variance": "two_pass", "save_stats": 0},
        doc="s = a + b; (LayerNorm(s), s); variance and save_stats (then also mean, rstd of s) "
        "as LayerNorm's",
    )
)
_register(
    OpDef(
        "AddRmsNorm", "reduction", _add_norm, _add_rms_norm, 3, attrs={"eps": 1e-6, "save_stats": 0},
        doc="s = a + b; (RMSNorm(s), s); save_stats=1 also outputs the rstd of s",
    )
)
_register(
    OpDef(
        "MatMul", "contraction", _matmul, _matmul_ref, (2, 3), attrs={"trans_a": 0, "trans_b": 0},
        doc="batched op(a) @ op(b) (+ bias), numpy semantics; op swaps the last two axes when trans_a / trans_b",
    )
)
_register(OpDef("Reshape", "layout", _reshape, _reshape_ref, 1, attrs={"shape": ()}, doc="same data, new shape"))
_register(OpDef("Transpose", "layout", _transpose, _transpose_ref, 1, attrs={"perm": ()}, doc="permute axes"))
_register(
    OpDef(
        "Concat", "layout", _concat,
        lambda attrs, *xs: (np.concatenate(xs, axis=attrs["axis"]),),
        None, attrs={"axis": 0}, doc="join along an axis",
    )
)
_register(OpDef("Split", "layout", _split, _split_ref, 1, attrs={"axis": 0, "sizes": ()}, doc="cut along an axis"))
_register(
    OpDef(
        "Slice", "layout", _slice,
        lambda attrs, x: (np.ascontiguousarray(x[slice_index(attrs, x.shape)]),),
        1, attrs={"starts": (), "ends": (), "axes": (), "steps": ()}, doc="strided window",
    )
)
_register(
    OpDef(
        "Expand", "layout", _expand,
        lambda attrs, x: (np.ascontiguousarray(np.broadcast_to(x, _expand(attrs, [Value("x", x.shape)])[0][0])),),
        1, attrs={"shape": ()}, doc="broadcast to a shape",
    )
)


_register(
    OpDef(
        "Conv", "contraction", _conv, _conv_ref, (2, 3),
        attrs={"strides": (), "pads": (), "dilations": (), "group": 1},
        doc="ONNX Conv (N, C, spatial...) with W (M, C/group, k...), optional bias (M,); explicit pads",
    )
)
_register(
    OpDef(
        "MaxPool", "window", _pool, _max_pool_ref, 1,
        attrs={"kernel_shape": (), "strides": (), "pads": (), "dilations": (), "ceil_mode": 0},
        doc="max over each window (padding never wins)",
    )
)
_register(
    OpDef(
        "AveragePool", "window", _pool, _avg_pool_ref, 1,
        attrs={"kernel_shape": (), "strides": (), "pads": (), "ceil_mode": 0, "count_include_pad": 0},
        doc="mean over each window; count_include_pad counts the explicit padding",
    )
)
_register(
    OpDef(
        "Gather", "layout", _gather, _gather_ref, 2, attrs={"axis": 0},
        doc="take(data, indices, axis); negative indices count from the end",
    )
)
_register(
    OpDef(
        "Attention", "attention", _attention, _attention_ref, (3, 4), attrs={"scale": 1.0, "kv_block": 0},
        doc="softmax(q @ k^T * scale + mask) @ v with k as (..., Sk, D); kv_block is the kernel's key block",
    )
)


def _rotary(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x, cos, sin = ins
    if not x.shape or x.shape[-1] % 2:
        raise ValueError(f"RotaryPositionEmbedding needs an even last axis, got {x.shape}")
    if attrs.get("mode", 0) not in (0, 1):
        raise ValueError(f"RotaryPositionEmbedding mode must be 0 (halves) or 1 (interleaved), got {attrs['mode']}")
    for t in (cos, sin):
        if not t.shape or t.shape[-1] != x.shape[-1] or broadcast_shapes(x.shape, t.shape) != x.shape:
            raise ValueError(f"cos / sin {t.shape} must broadcast to x {x.shape} along its full last axis")
    return [(x.shape, x.dtype)]


def rotate(x: np.ndarray, mode: int) -> np.ndarray:
    """The rotation of rotary embeddings: mode 0 is ``concat(-x2, x1)`` of the halves x1, x2 of the
    last axis (GPT-NeoX / LLaMA ``rotate_half``), mode 1 pairs neighbours: ``(-x[2i+1], x[2i])``."""
    if mode == 0:
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def _rotary_ref(attrs: Mapping[str, Any], x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple:
    return ((x * cos + rotate(x, int(attrs.get("mode", 0))) * sin).astype(x.dtype, copy=False),)


_register(
    OpDef(
        "RotaryPositionEmbedding", "opaque", _rotary, _rotary_ref, 3, attrs={"mode": 0},
        doc="x * cos + rotate(x) * sin; rotate is concat(-x2, x1) of the last axis' halves (mode 0) "
        "or (-x[2i+1], x[2i]) pairs (mode 1); cos, sin broadcast to x",
    )
)


def infer_node(node: Node, inputs: Sequence[Value]) -> list[tuple[Shape, str]]:
    """Apply the op's shape rule to ``node``; raise ``ValueError`` naming the node on failure."""
    op = get_op(node.op)
    if not op.check_arity(len(inputs)):
        raise ValueError(f"node {node.name}: {node.op} takes {op.arity} inputs, got {len(inputs)}")
    attrs = {**op.attrs, **node.attrs}
    try:
        outs = op.infer(attrs, inputs)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"node {node.name} ({node.op}): {exc}") from None
    if len(outs) != len(node.outputs):
        raise ValueError(f"node {node.name}: {node.op} makes {len(outs)} outputs, node names {len(node.outputs)}")
    return outs


def run_reference(node: Node, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Evaluate one node with its numpy reference."""
    op = get_op(node.op)
    attrs = {**op.attrs, **node.attrs}
    with np.errstate(all="ignore"):
        return tuple(np.asarray(a) for a in op.reference(attrs, *arrays))


# The ops real exporters emit on live data, registered by their own modules (they import this one).
from fusiontune.ir import _ops_grad, _ops_index, _ops_logic  # noqa: E402, F401
