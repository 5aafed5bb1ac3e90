"""The ONNX converter table: one function per ONNX op type, writing catalogue nodes.

A converter is ``(importer, node, inputs, attrs) -> output value names``: ``inputs`` are IR value
names (None for an omitted optional input) and ``attrs`` the node's attributes as Python values.
It emits catalogue nodes through :meth:`Importer.emit`, which folds any node whose inputs are all
known, so shape subgraphs never reach the graph. Opset differences (attributes that became inputs,
Softmax's 2-D coercion before opset 13, ...) are handled here, next to the op they concern.
:func:`unsupported_reason` is the check made, before any conversion starts, for every node that
depends on live data (ir/_onnx_fold.py decides which do; the others fold, through their converter
or onnx.reference). More converters live in ``_onnx_ops_logic``, ``_onnx_ops_index`` and
``_onnx_ops_sequence``, imported at the end of this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fusiontune.ir.graph import DTYPES
from fusiontune.ir.onnx_import import Importer, np_dtype
from fusiontune.ir.ops import normalize_axis

Converter = Callable[[Importer, Any, list[Any], dict[str, Any]], list[str]]
CONVERTERS: dict[str, Converter] = {}


def _conv(*names: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return register


def attributes(node: Any) -> dict[str, Any]:
    """The node's attributes as Python values (strings decoded, tensors as numpy arrays)."""
    import onnx
    from onnx import numpy_helper

    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def unsupported_reason(node: Any, opset: int, initializers: Mapping[str, Any]) -> str | None:
    """Why ``node`` cannot be imported (the op type, or the op with the unsupported attribute value),
    or None when it can."""
    if node.domain not in ("", "ai.onnx"):
        return f"{node.domain}.{node.op_type}"
    op = node.op_type
    if op not in CONVERTERS:
        return op
    attrs = attributes(node)
    extra_outputs = any(node.output[1:])
    if op in ("Conv", "MaxPool", "AveragePool"):
        kernel = attrs.get("kernel_shape")
        if kernel is None and op == "Conv" and len(node.input) > 1 and node.input[1] in initializers:
            kernel = list(initializers[node.input[1]].dims)[2:]
        if kernel is not None and not 1 <= len(kernel) <= 3:
            return f"{op} with {len(kernel)} spatial axes"
    if op == "MaxPool" and extra_outputs:
        return "MaxPool with an Indices output"
    if op == "BatchNormalization" and (attrs.get("training_mode", 0) or extra_outputs):
        return "BatchNormalization in training mode"
    if op == "Dropout":
        mode = node.input[2] if len(node.input) > 2 else ""
        if attrs.get("is_test", 1) == 0 or (mode and not _false_initializer(initializers.get(mode))):
            return "Dropout in training mode"
    if op == "LayerNormalization" and extra_outputs:
        return "LayerNormalization with Mean / InvStdDev outputs"
    if op == "Cast" and np_dtype(attrs.get("to", 0)) not in DTYPES:
        return f"Cast to {np_dtype(attrs.get('to', 0))}"
    if op == "Constant" and not ({"value", "value_float", "value_floats", "value_int", "value_ints"} & set(attrs)):
        return f"Constant with {', '.join(attrs) or 'no value'}"
    if op == "Gelu" and attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"Gelu approximate={attrs['approximate']!r}"
    if op == "Conv" and attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return f"Conv auto_pad={attrs['auto_pad']!r}"
    return None


# ---- helpers ---------------------------------------------------------------------------------
def _false_initializer(tensor: Any) -> bool:
    from onnx import numpy_helper

    return tensor is not None and not bool(numpy_helper.to_array(tensor).any())


def _ints(arr: Any) -> list[int]:
    return [int(v) for v in np.asarray(arr).reshape(-1)]


def _axes(imp: Importer, ins: list[Any], attrs: dict[str, Any], index: int, first_input_opset: int) -> list[int] | None:
    """Axes given as an attribute (older opsets) or as input ``index`` (newer ones)."""
    if imp.opset >= first_input_opset:
        if len(ins) > index and ins[index] is not None:
            return _ints(imp.constant_of(ins[index], "axes"))
        return None
    return list(attrs["axes"]) if "axes" in attrs else None


def _alias(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return [ins[0]]


def _known_out(imp: Importer, node: Any, array: Any) -> list[str]:
    return [imp.bind_known(node.output[0], np.asarray(array))]


# ---- elementwise -----------------------------------------------------------------------------
def _simple(op: str) -> Converter:
    def convert(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
        return imp.emit(op, ins, {}, node.output[:1])

    return convert


def _binary(op: str) -> Converter:
    def convert(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
        return imp.emit(op, _legacy_broadcast(imp, ins, attrs), {}, node.output[:1])

    return convert


def _legacy_broadcast(imp: Importer, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """Before opset 7, ``broadcast=1, axis=k`` aligns B with A's axes from k (not from the end)."""
    if imp.opset >= 7 or not attrs.get("broadcast", 0) or "axis" not in attrs:
        return ins
    a, b = ins
    rank_a, shape_b = len(imp.shape(a)), imp.shape(b)
    axis = normalize_axis(int(attrs["axis"]), rank_a)
    return [a, imp.reshape(b, (*shape_b, *(1,) * (rank_a - axis - len(shape_b))), tag="broadcast")]


for _name in ("Relu", "Sigmoid", "Sqrt", "Erf", "Tanh", "Exp", "Log", "Neg", "Reciprocal", "HardSwish", "Where"):
    CONVERTERS[_name] = _simple(_name)
for _name in ("Add", "Sub", "Mul", "Equal", "Greater", "Less"):
    CONVERTERS[_name] = _binary(_name)


@_conv("Div")
def _div(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    a, b = ins = _legacy_broadcast(imp, ins, attrs)
    if imp.dtype(a).startswith("int") and imp.dtype(b).startswith("int"):
        if a in imp.known and b in imp.known:  # ONNX integer division truncates toward zero
            x, y = imp.known[a], imp.known[b]
            return _known_out(imp, node, (np.sign(x) * np.sign(y) * (np.abs(x) // np.abs(y))).astype(x.dtype))
        raise imp.fail("integer Div of a tensor that depends on a graph input")
    return imp.emit("Div", ins, {}, node.output[:1])


@_conv("Pow")
def _pow(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    base, exponent = _legacy_broadcast(imp, ins, attrs)
    if imp.dtype(base) != imp.dtype(exponent) and not imp.dtype(base).startswith("int"):
        exponent = imp.cast_like(exponent, imp.dtype(base))  # ONNX Pow's output has the base's type
    return imp.emit("Pow", [base, exponent], {}, node.output[:1])


@_conv("Sum", "Max", "Min")
def _variadic(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    op = {"Sum": "Add", "Max": "Maximum", "Min": "Minimum"}[node.op_type]
    acc = ins[0]
    for i, x in enumerate(ins[1:]):
        last = i == len(ins) - 2
        acc = imp.emit(op, [acc, x], {}, node.output[:1] if last else None, tag=None if last else f"{op.lower()}{i}")[0]
    return [acc]


@_conv("Clip")
def _clip(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    if imp.opset < 11:
        lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
    else:
        lo = float(imp.constant_of(ins[1], "Clip min")) if len(ins) > 1 and ins[1] else -np.inf
        hi = float(imp.constant_of(ins[2], "Clip max")) if len(ins) > 2 and ins[2] else np.inf
    return imp.emit("Clip", ins[:1], {"min": float(lo), "max": float(hi)}, node.output[:1])


@_conv("LeakyRelu")
def _leaky(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return imp.emit("LeakyRelu", ins[:1], {"alpha": float(attrs.get("alpha", 0.01))}, node.output[:1])


@_conv("HardSigmoid")
def _hard_sigmoid(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    a = {"alpha": float(attrs.get("alpha", 0.2)), "beta": float(attrs.get("beta", 0.5))}
    return imp.emit("HardSigmoid", ins[:1], a, node.output[:1])


@_conv("Gelu")
def _gelu(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return imp.emit("Gelu", ins[:1], {"approximate": attrs.get("approximate", "none")}, node.output[:1])


@_conv("Cast")
def _cast(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    to = np_dtype(attrs["to"])
    if imp.dtype(ins[0]) == to:
        return [ins[0]]
    return imp.emit("Cast", ins[:1], {"to": to}, node.output[:1])


# ---- reductions and normalizations -----------------------------------------------------------
@_conv("ReduceMean", "ReduceSum", "ReduceMax")
def _reduce(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    axes = _axes(imp, ins, attrs, 1, 13 if node.op_type == "ReduceSum" else 18)
    keepdims = bool(attrs.get("keepdims", 1))
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return [ins[0]]
        axes = None
    rank = len(imp.shape(ins[0]))
    norm = None if axes is None else tuple(sorted({normalize_axis(a, rank) for a in axes}))
    return imp.emit(node.op_type, ins[:1], {"axes": norm, "keepdims": keepdims}, node.output[:1])


@_conv("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    op = "ReduceMean" if node.op_type == "GlobalAveragePool" else "ReduceMax"
    rank = len(imp.shape(ins[0]))
    return imp.emit(op, ins[:1], {"axes": tuple(range(2, rank)), "keepdims": True}, node.output[:1])


@_conv("Softmax")
def _softmax(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x = ins[0]
    shape = imp.shape(x)
    rank = len(shape)
    axis = normalize_axis(int(attrs.get("axis", -1 if imp.opset >= 13 else 1)), rank)
    if axis == rank - 1:
        return imp.emit("Softmax", [x], {"axis": -1}, node.output[:1])
    if imp.opset < 13:  # softmax over the flattened trailing axes [axis, rank)
        flat = imp.reshape(x, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))
        s = imp.emit("Softmax", [flat], {"axis": -1}, tag="softmax")[0]
        return [imp.reshape(s, shape, node.output[:1], tag=None)]
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]  # a swap: its own inverse
    t = imp.emit("Transpose", [x], {"perm": tuple(perm)}, tag="to_last")[0]
    s = imp.emit("Softmax", [t], {"axis": -1}, tag="softmax")[0]
    return imp.emit("Transpose", [s], {"perm": tuple(perm)}, node.output[:1])


@_conv("LayerNormalization")
def _layer_norm(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    shape = imp.shape(x)
    axis = normalize_axis(int(attrs.get("axis", -1)), len(shape))
    trailing = shape[axis:]
    n = int(np.prod(trailing))
    dtype = imp.dtype(x)

    def param(p: str | None, fill: float, what: str) -> str:
        if p is None:
            return imp.const(np.full((n,), fill, dtype), what)
        if imp.shape(p) != trailing:
            p = imp.emit("Expand", [p], {"shape": trailing}, tag=f"{what}_expand")[0]
        return imp.reshape(p, (n,), tag=f"{what}_flat")

    g, b = param(scale, 1.0, "scale"), param(bias, 0.0, "bias")
    eps = float(attrs.get("epsilon", 1e-5))
    if axis == len(shape) - 1:
        return imp.emit("LayerNorm", [x, g, b], {"eps": eps}, node.output[:1])
    flat = imp.reshape(x, (*shape[:axis], n), tag="flatten")
    y = imp.emit("LayerNorm", [flat, g, b], {"eps": eps}, tag="layernorm")[0]
    return [imp.reshape(y, shape, node.output[:1], tag=None)]


@_conv("BatchNormalization")
def _batch_norm(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x = ins[0]
    shape = imp.shape(x)
    param_shape = (shape[1],) + (1,) * (len(shape) - 2)
    params = [imp.reshape(p, param_shape, tag=f"param{i}") for i, p in enumerate(ins[1:5])]
    return imp.emit("BatchNorm", [x, *params], {"eps": float(attrs.get("epsilon", 1e-5))}, node.output[:1])


@_conv("LRN")
def _lrn(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """Local response normalization across channels, written with catalogue ops:
    ``x / (bias + alpha / size * square_sum) ** beta``, where ``square_sum`` (the sum of x^2 over
    the channel window ``[c - floor((size-1)/2), c + ceil((size-1)/2)]``) is a Conv of x^2, seen
    as an (N, 1, C, H*W) image, with a (1, 1, size, 1) kernel of ones and zero padding."""
    x = ins[0]
    shape = imp.shape(x)
    dtype = imp.dtype(x)
    size = int(attrs["size"])
    alpha, beta, bias = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))
    rest = int(np.prod(shape[2:]))
    sq = imp.emit("Mul", [x, x], tag="square")[0]
    image = imp.reshape(sq, (shape[0], 1, shape[1], rest), tag="channels_as_rows")
    ones = imp.const(np.ones((1, 1, size, 1), dtype), "window")
    pads = ((size - 1) // 2, 0, size - 1 - (size - 1) // 2, 0)
    window = imp.emit("Conv", [image, ones], {"pads": pads}, tag="square_sum")[0]
    total = imp.reshape(window, shape, tag="square_sum_shape")
    scaled = imp.emit("Mul", [total, imp.const(np.asarray(alpha / size, dtype), "alpha")], tag="scale")[0]
    base = imp.emit("Add", [scaled, imp.const(np.asarray(bias, dtype), "bias")], tag="bias")[0]
    denom = imp.emit("Pow", [base, imp.const(np.asarray(beta, dtype), "beta")], tag="pow")[0]
    return imp.emit("Div", [x, denom], None, node.output[:1])


# ---- contractions and windows ----------------------------------------------------------------
@_conv("MatMul")
def _matmul(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    a, b = ins
    sa, sb = imp.shape(a), imp.shape(b)
    if len(sa) >= 2 and len(sb) >= 2:
        return imp.emit("MatMul", [a, b], {}, node.output[:1])
    # numpy's 1-D rules: a vector operand gets a unit axis, which the result then drops
    a2 = imp.reshape(a, (1, sa[0]), tag="a_row") if len(sa) == 1 else a
    b2 = imp.reshape(b, (sb[0], 1), tag="b_col") if len(sb) == 1 else b
    y = imp.emit("MatMul", [a2, b2], {}, tag="matmul")[0]
    out = list(imp.shape(y))
    if len(sb) == 1:
        out.pop(-1)
    if len(sa) == 1:
        out.pop(-2 if len(sb) != 1 else -1)
    return [imp.reshape(y, out, node.output[:1], tag=None)]


@_conv("Gemm")
def _gemm(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """``alpha * A' @ B' + beta * C``: transposes and scales fold into constant operands."""
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    dtype = imp.dtype(a)
    if attrs.get("transA", 0):
        a = imp.emit("Transpose", [a], {"perm": (1, 0)}, tag="transpose_a")[0]
    if attrs.get("transB", 0):
        b = imp.emit("Transpose", [b], {"perm": (1, 0)}, tag="transpose_b")[0]
    scale_after = False
    if alpha != 1.0:
        if b in imp.known:
            b = imp.emit("Mul", [b, imp.const(np.asarray(alpha, dtype), "alpha")], tag="alpha_b")[0]
        elif a in imp.known:
            a = imp.emit("Mul", [a, imp.const(np.asarray(alpha, dtype), "alpha")], tag="alpha_a")[0]
        else:
            scale_after = True
    if c is not None and beta != 1.0:
        c = imp.emit("Mul", [c, imp.const(np.asarray(beta, dtype), "beta")], tag="beta_c")[0]
    if c is not None and beta == 0.0 and c in imp.known:
        c = None
    if not scale_after:
        return imp.emit("MatMul", [a, b] + ([c] if c is not None else []), {}, node.output[:1])
    y = imp.emit("MatMul", [a, b], {}, tag="matmul")[0]
    if c is None:
        return imp.emit("Mul", [y, imp.const(np.asarray(alpha, dtype), "alpha")], {}, node.output[:1])
    y = imp.emit("Mul", [y, imp.const(np.asarray(alpha, dtype), "alpha")], tag="alpha")[0]
    return imp.emit("Add", [y, c], {}, node.output[:1])


def _pads(imp: Importer, attrs: dict[str, Any], spatial_in: Sequence[int], kernel: Sequence[int],
          strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    """Explicit ``[begin..., end...]`` pads, with ``auto_pad`` resolved as onnxruntime does."""
    n = len(spatial_in)
    auto = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        pads = tuple(int(p) for p in attrs.get("pads", (0,) * (2 * n)))
        if len(pads) != 2 * n:
            raise imp.fail(f"pads {list(pads)} do not fit {n} spatial axes")
        return pads
    if auto == "VALID":
        return (0,) * (2 * n)
    begins, ends = [], []
    for size, k, s, d in zip(spatial_in, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return tuple(begins + ends)


def _window(imp: Importer, attrs: dict[str, Any], x: str, kernel: Sequence[int]) -> dict[str, Any]:
    spatial = len(imp.shape(x)) - 2
    if len(kernel) != spatial:
        raise imp.fail(f"kernel {list(kernel)} does not fit input {imp.shape(x)}")
    strides = tuple(int(s) for s in attrs.get("strides", (1,) * spatial))
    dilations = tuple(int(d) for d in attrs.get("dilations", (1,) * spatial))
    pads = _pads(imp, attrs, imp.shape(x)[2:], kernel, strides, dilations)
    return {"strides": strides, "pads": pads, "dilations": dilations}


@_conv("Conv")
def _conv_op(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x, w = ins[0], ins[1]
    kernel = imp.shape(w)[2:]
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != tuple(kernel):
        raise imp.fail(f"kernel_shape {attrs['kernel_shape']} differs from the weight's {list(kernel)}")
    a = _window(imp, attrs, x, kernel)
    a["group"] = int(attrs.get("group", 1))
    bias = [ins[2]] if len(ins) > 2 and ins[2] is not None else []
    return imp.emit("Conv", [x, w, *bias], a, node.output[:1])


@_conv("MaxPool", "AveragePool")
def _pool(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    a = _window(imp, attrs, ins[0], kernel)
    a["kernel_shape"] = kernel
    a["ceil_mode"] = int(attrs.get("ceil_mode", 0))
    if node.op_type == "AveragePool":
        a["count_include_pad"] = int(attrs.get("count_include_pad", 0))
        if all(d == 1 for d in a["dilations"]):
            del a["dilations"]
    return imp.emit(node.op_type, ins[:1], a, node.output[:1])


# ---- layout ----------------------------------------------------------------------------------
@_conv("Reshape")
def _reshape(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x = ins[0]
    src = imp.shape(x)
    target = _ints(imp.constant_of(ins[1], "Reshape's shape") if imp.opset >= 5 else attrs["shape"])
    if not attrs.get("allowzero", 0):
        target = [src[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) == 1:
        known = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(src)) // known if known else 0
    if int(np.prod(target)) != int(np.prod(src)) or any(d < 0 for d in target):
        raise imp.fail(f"cannot reshape {src} to {target}")
    if tuple(target) == src:
        return [x]
    return [imp.reshape(x, target, node.output[:1], tag=None)]


@_conv("Flatten")
def _flatten(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = imp.shape(ins[0])
    axis = int(attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    target = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    if target == shape:
        return [ins[0]]
    return [imp.reshape(ins[0], target, node.output[:1], tag=None)]


@_conv("Squeeze")
def _squeeze(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = imp.shape(ins[0])
    axes = _axes(imp, ins, attrs, 1, 13)
    drop = {i for i, d in enumerate(shape) if d == 1} if axes is None else {normalize_axis(a, len(shape)) for a in axes}
    for a in drop:
        if shape[a] != 1:
            raise imp.fail(f"cannot squeeze axis {a} of shape {shape}")
    target = [d for i, d in enumerate(shape) if i not in drop]
    return [imp.reshape(ins[0], target, node.output[:1], tag=None)]


@_conv("Unsqueeze")
def _unsqueeze(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = list(imp.shape(ins[0]))
    axes = _axes(imp, ins, attrs, 1, 13) or []
    rank = len(shape) + len(axes)
    for a in sorted(normalize_axis(a, rank) for a in axes):
        shape.insert(a, 1)
    return [imp.reshape(ins[0], shape, node.output[:1], tag=None)]


@_conv("Transpose")
def _transpose(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    rank = len(imp.shape(ins[0]))
    perm = tuple(int(p) for p in attrs.get("perm", reversed(range(rank))))
    if perm == tuple(range(rank)):
        return [ins[0]]
    return imp.emit("Transpose", ins[:1], {"perm": perm}, node.output[:1])


@_conv("Concat")
def _concat(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    parts = [i for i in ins if i is not None]
    if len(parts) == 1:
        return parts
    return imp.emit("Concat", parts, {"axis": int(attrs["axis"])}, node.output[:1])


@_conv("Split")
def _split(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = imp.shape(ins[0])
    axis = normalize_axis(int(attrs.get("axis", 0)), len(shape))
    dim = shape[axis]
    n = len(node.output)
    if imp.opset < 13 and "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]
    elif imp.opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = _ints(imp.constant_of(ins[1], "Split's split"))
    elif "num_outputs" in attrs:  # opset 18: the last chunk may be smaller
        k = int(attrs["num_outputs"])
        chunk = -(-dim // k)
        sizes = [chunk] * (k - 1) + [dim - chunk * (k - 1)]
    else:
        if dim % n:
            raise imp.fail(f"cannot split {dim} into {n} equal parts")
        sizes = [dim // n] * n
    outs = [o or imp.fresh(f"{imp.current}/unused{i}") for i, o in enumerate(node.output)]
    return imp.emit("Split", ins[:1], {"axis": axis, "sizes": tuple(sizes)}, outs, n_out=len(outs))


@_conv("Slice")
def _slice(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = imp.shape(ins[0])
    if imp.opset < 10:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = _ints(imp.constant_of(ins[1], "Slice starts"))
        ends = _ints(imp.constant_of(ins[2], "Slice ends"))
        axes = _ints(imp.constant_of(ins[3], "Slice axes")) if len(ins) > 3 and ins[3] else list(range(len(starts)))
        steps = _ints(imp.constant_of(ins[4], "Slice steps")) if len(ins) > 4 and ins[4] else [1] * len(starts)
    s_out, e_out, a_out, st_out = [], [], [], []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise imp.fail("Slice step 0")
        ax = normalize_axis(axis, len(shape))
        dim = shape[ax]
        # Python's slice clamps exactly as ONNX does; resolve it to in-range numbers, writing
        # "before index 0" (stop -1 of a negative step) as -dim-1 so it means the same again.
        b, e, st = slice(start, end, step).indices(dim)
        if st < 0 and e < 0:
            e = -dim - 1
        s_out.append(b)
        e_out.append(e)
        a_out.append(ax)
        st_out.append(st)
    if not a_out:
        return [ins[0]]
    a = {"starts": tuple(s_out), "ends": tuple(e_out), "axes": tuple(a_out), "steps": tuple(st_out)}
    return imp.emit("Slice", ins[:1], a, node.output[:1])


@_conv("Gather")
def _gather(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return imp.emit("Gather", ins[:2], {"axis": int(attrs.get("axis", 0))}, node.output[:1])


@_conv("Expand")
def _expand(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = tuple(_ints(imp.constant_of(ins[1], "Expand's shape")))
    return imp.emit("Expand", ins[:1], {"shape": shape}, node.output[:1])


# ---- values known at import ------------------------------------------------------------------
@_conv("Shape")
def _shape(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = imp.shape(ins[0])
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    return _known_out(imp, node, np.asarray(shape[start:end], dtype=np.int64))


@_conv("Size")
def _size(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return _known_out(imp, node, np.asarray(int(np.prod(imp.shape(ins[0]))), dtype=np.int64))


@_conv("ConstantOfShape")
def _constant_of_shape(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    shape = _ints(imp.constant_of(ins[0], "ConstantOfShape's shape"))
    value = np.asarray(attrs.get("value", np.zeros(1, np.float32)))
    return _known_out(imp, node, np.full(shape, value.reshape(-1)[0], dtype=value.dtype))


@_conv("Constant")
def _constant(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    if "value" in attrs:
        arr = np.asarray(attrs["value"])
    elif "value_float" in attrs:
        arr = np.asarray(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        arr = np.asarray(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        arr = np.asarray(attrs["value_int"], np.int64)
    else:
        arr = np.asarray(attrs["value_ints"], np.int64)
    if arr.dtype.kind in "iu" and str(arr.dtype) not in DTYPES:
        arr = arr.astype(np.int64)
    return _known_out(imp, node, arr)


@_conv("Identity")
def _identity(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return [ins[0]]


@_conv("Dropout")
def _dropout(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """Inference: the identity; the mask output, when asked for, is all true."""
    outs = [ins[0]]
    if len(node.output) > 1 and node.output[1]:
        imp.bind_known(node.output[1], np.ones(imp.shape(ins[0]), dtype=bool))
        outs.append(node.output[1])
    return outs



# Converters of the ops real exporters emit, in modules of their own (they import this one).
from fusiontune.ir import _onnx_ops_index, _onnx_ops_logic, _onnx_ops_sequence  # noqa: E402, F401
