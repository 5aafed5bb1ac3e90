"""Catalogue ops for the index, layout and window ops real exporters emit on live data.

Each op is registered into :data:`fusiontune.ir.ops.CATALOGUE` with its kind, shape rule and
numpy reference, exactly like the ops of ``ops.py``. The references follow the ONNX definitions:

* ``GatherND`` / ``GatherElements`` / ``ScatterND``: negative indices count from the end of their
  axis; an index outside ``[-n, n)`` raises ``IndexError`` (as onnxruntime fails the run).
  ``ScatterND`` applies its updates in index order, so with ``reduction="none"`` a repeated index
  keeps its last update; ``add`` / ``mul`` / ``max`` / ``min`` combine every update.
* ``CumSum``: a running sum in the input's dtype, element after element (numpy's order), with
  ONNX's ``exclusive`` and ``reverse``.
* ``Trilu``: the upper (``upper=1``) or lower triangle of the last two axes, diagonal offset ``k``.
* ``Tile``: ``np.tile`` with one repeat count per axis.
* ``Pad``: ``pads`` as ``[begin..., end...]`` over every axis; a negative pad crops first, then
  ``mode`` (``constant`` with ``value``, ``reflect``, ``edge``, ``wrap``) pads what is left.
* ``ConvTranspose``: the gradient of Conv with respect to its input, written straight from the
  definition: every input element scatters ``x[n, c, i, j] * W[c, m, p, q]`` to output position
  ``(i * stride + p * dilation - pad_begin, j * stride + q * dilation - pad_begin)``;
  ``output_padding`` adds positions at the end that receive nothing but the bias. The importer
  resolves ``auto_pad`` and ``output_shape`` into explicit pads.

All of them but ConvTranspose are ``layout`` ops (each a kernel of its own, codegen/index.py);
ConvTranspose is a ``contraction`` (codegen/conv_transpose.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fusiontune.ir.graph import Shape, Value
from fusiontune.ir.ops import OpDef, _register, normalize_axis, result_dtype

PAD_MODES = ("constant", "reflect", "edge", "wrap")
"""Values of Pad's ``mode`` attribute."""
SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")
"""Values of ScatterND's ``reduction`` attribute."""


def _check_int(v: Value, what: str) -> None:
    if not v.dtype.startswith("int"):
        raise ValueError(f"{what} must be integers, got {v.dtype}")


def _in_range(idx: np.ndarray, n: int | np.ndarray, op: str) -> np.ndarray:
    """``idx`` with negative entries counted from the end; ``IndexError`` outside ``[-n, n)``."""
    if idx.size and (np.any(idx < -n) or np.any(idx >= n)):
        raise IndexError(f"{op} index out of range")
    return np.where(idx < 0, idx + n, idx)


# ---- GatherND ------------------------------------------------------------------------------------
def _gather_nd(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    data, idx = ins
    _check_int(idx, "GatherND indices")
    b = int(attrs.get("batch_dims", 0))
    r, q = len(data.shape), len(idx.shape)
    if q < 1 or not 0 <= b < min(r, q):
        raise ValueError(f"GatherND batch_dims {b} does not fit data {data.shape}, indices {idx.shape}")
    if data.shape[:b] != idx.shape[:b]:
        raise ValueError(f"GatherND batch dims differ: data {data.shape}, indices {idx.shape}")
    m = idx.shape[-1]
    if not 1 <= m <= r - b:
        raise ValueError(f"GatherND index length {m} must be in [1, {r - b}] for data {data.shape}")
    return [(idx.shape[:-1] + data.shape[b + m :], data.dtype)]


def _gather_nd_ref(attrs: Mapping[str, Any], data: np.ndarray, idx: np.ndarray) -> tuple:
    b = int(attrs.get("batch_dims", 0))
    m = idx.shape[-1]
    dims = np.asarray(data.shape[b : b + m])
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape(batch, *data.shape[b:])
    i = _in_range(idx.reshape(batch, -1, m), dims, "GatherND")
    rows = np.arange(batch).reshape(batch, 1)
    out = d[(rows, *(i[..., k] for k in range(m)))]
    return (np.ascontiguousarray(out.reshape(idx.shape[:-1] + data.shape[b + m :])),)


# ---- GatherElements ------------------------------------------------------------------------------
def _gather_elements(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    data, idx = ins
    _check_int(idx, "GatherElements indices")
    if len(idx.shape) != len(data.shape) or not data.shape:
        raise ValueError(f"GatherElements needs indices of the data's rank, got {idx.shape} and {data.shape}")
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape))
    for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)):
        if k != axis and i > d:
            raise ValueError(f"GatherElements indices {idx.shape} exceed data {data.shape} on axis {k}")
    return [(idx.shape, data.dtype)]


def _gather_elements_ref(attrs: Mapping[str, Any], data: np.ndarray, idx: np.ndarray) -> tuple:
    axis = normalize_axis(attrs.get("axis", 0), data.ndim)
    where: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    where[axis] = _in_range(idx, data.shape[axis], "GatherElements")
    return (np.ascontiguousarray(data[tuple(where)]),)


# ---- ScatterND -----------------------------------------------------------------------------------
def _scatter_nd(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    data, idx, upd = ins
    _check_int(idx, "ScatterND indices")
    if attrs.get("reduction", "none") not in SCATTER_REDUCTIONS:
        raise ValueError(f"ScatterND reduction must be one of {SCATTER_REDUCTIONS}, got {attrs['reduction']!r}")
    if not idx.shape or not 1 <= idx.shape[-1] <= len(data.shape):
        raise ValueError(f"ScatterND indices {idx.shape} do not fit data {data.shape}")
    want = idx.shape[:-1] + data.shape[idx.shape[-1] :]
    if upd.shape != want:
        raise ValueError(f"ScatterND updates must have shape {want}, got {upd.shape}")
    if upd.dtype != data.dtype:
        raise ValueError(f"ScatterND updates ({upd.dtype}) and data ({data.dtype}) differ in dtype")
    return [(data.shape, data.dtype)]


_SCATTER_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_nd_ref(attrs: Mapping[str, Any], data: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> tuple:
    m = idx.shape[-1]
    dims = np.asarray(data.shape[:m])
    i = _in_range(idx.reshape(-1, m), dims, "ScatterND")
    u = upd.reshape(i.shape[0], *data.shape[m:])
    out = np.array(data, copy=True)
    where = tuple(i[:, k] for k in range(m))
    reduction = attrs.get("reduction", "none")
    if reduction == "none":
        for p in range(i.shape[0]):  # in index order: a repeated index keeps its last update
            out[tuple(int(w[p]) for w in where)] = u[p]
    else:
        _SCATTER_UFUNC[reduction].at(out, where, u)
    return (out,)


# ---- CumSum, Trilu, Tile -------------------------------------------------------------------------
def _cumsum(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x = ins[0]
    if x.dtype == "bool":
        raise ValueError("CumSum of a bool tensor")
    normalize_axis(int(attrs.get("axis", 0)), len(x.shape))
    return [(x.shape, x.dtype)]


def _cumsum_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    axis = normalize_axis(int(attrs.get("axis", 0)), x.ndim)
    reverse, exclusive = bool(attrs.get("reverse", 0)), bool(attrs.get("exclusive", 0))
    y = np.flip(x, axis) if reverse else x
    if exclusive and x.shape[axis]:  # the sum of the elements strictly before: shift the input by one
        head = np.zeros_like(np.take(y, [0], axis=axis))
        y = np.concatenate([head, np.take(y, np.arange(y.shape[axis] - 1), axis=axis)], axis=axis)
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    return (np.ascontiguousarray(np.flip(out, axis) if reverse else out),)


def _trilu(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    if len(ins[0].shape) < 2:
        raise ValueError(f"Trilu needs rank >= 2, got {ins[0].shape}")
    return [(ins[0].shape, ins[0].dtype)]


def _trilu_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    k = int(attrs.get("k", 0))
    return ((np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)).astype(x.dtype, copy=False),)


def _tile(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    shape = ins[0].shape
    reps = tuple(int(r) for r in attrs["repeats"])
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise ValueError(f"Tile repeats {reps} must be one count >= 0 per axis of {shape}")
    return [(tuple(d * r for d, r in zip(shape, reps, strict=True)), ins[0].dtype)]


def _tile_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    reps = tuple(int(r) for r in attrs["repeats"])
    return (np.ascontiguousarray(np.tile(x, reps) if reps else x.copy()),)


# ---- Pad -----------------------------------------------------------------------------------------
def pad_geometry(pads: Sequence[int], shape: Shape) -> list[tuple[int, int, int, int]]:
    """Per axis ``(begin pad, crop begin, kept length, end pad)``: a negative pad crops, then the
    kept part of the axis is padded (ONNX Pad with negative pads, as onnxruntime runs it).

    Raises:
        ValueError: ``pads`` is not ``2 * rank`` long, or crops more than an axis holds.
    """
    r = len(shape)
    if len(pads) != 2 * r:
        raise ValueError(f"Pad pads {list(pads)} must have 2 * rank = {2 * r} entries for {shape}")
    out = []
    for k, n in enumerate(shape):
        b, e = int(pads[k]), int(pads[r + k])
        kept = n - max(-b, 0) - max(-e, 0)
        if kept < 0:
            raise ValueError(f"Pad pads {list(pads)} crop more than axis {k} of {shape} holds")
        out.append((max(b, 0), max(-b, 0), kept, max(e, 0)))
    return out


def _pad(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x = ins[0]
    mode = attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise ValueError(f"Pad mode must be one of {PAD_MODES}, got {mode!r}")
    geo = pad_geometry(attrs["pads"], x.shape)
    if mode != "constant":
        for k, (b, _, kept, e) in enumerate(geo):
            if kept == 0 and (b or e):
                raise ValueError(f"Pad mode {mode!r} cannot pad the empty axis {k}")
    return [(tuple(b + kept + e for b, _, kept, e in geo), x.dtype)]


def _pad_ref(attrs: Mapping[str, Any], x: np.ndarray) -> tuple:
    geo = pad_geometry(attrs["pads"], x.shape)
    kept = x[tuple(slice(c, c + n) for _, c, n, _ in geo)]
    widths = [(b, e) for b, _, _, e in geo]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        value = np.asarray(attrs.get("value", 0.0)).astype(x.dtype)
        return (np.pad(kept, widths, mode="constant", constant_values=value),)
    # numpy's reflect and wrap repeat the reflection / the period for pads longer than the axis,
    # which is what the kernels' index maps do.
    return (np.pad(kept, widths, mode=mode).astype(x.dtype, copy=False),)


# ---- ConvTranspose -------------------------------------------------------------------------------
def conv_transpose_attrs(attrs: Mapping[str, Any], spatial: int) -> tuple[tuple[int, ...], ...]:
    """``(strides, pads, dilations, output_padding)`` with ONNX defaults for ``spatial`` axes."""
    strides = tuple(int(s) for s in attrs.get("strides") or (1,) * spatial)
    pads = tuple(int(p) for p in attrs.get("pads") or (0,) * (2 * spatial))
    dil = tuple(int(d) for d in attrs.get("dilations") or (1,) * spatial)
    extra = tuple(int(p) for p in attrs.get("output_padding") or (0,) * spatial)
    if len(strides) != spatial or len(pads) != 2 * spatial or len(dil) != spatial or len(extra) != spatial:
        raise ValueError(
            f"strides {strides}, pads {pads}, dilations {dil}, output_padding {extra} do not fit {spatial} spatial axes"
        )
    if min(strides) < 1 or min(dil) < 1 or min(pads, default=0) < 0 or min(extra) < 0:
        raise ValueError(f"ConvTranspose strides {strides} / dilations {dil} >= 1, pads {pads} / output_padding {extra} >= 0")
    return strides, pads, dil, extra


def _conv_transpose(attrs: Mapping[str, Any], ins: Sequence[Value]) -> list[tuple[Shape, str]]:
    x, w = ins[0].shape, ins[1].shape
    if len(x) not in (3, 4) or len(w) != len(x):
        raise ValueError(f"ConvTranspose needs X (N, C, L) or (N, C, H, W) and W of the same rank, got {x} and {w}")
    group = int(attrs.get("group", 1))
    if group < 1 or x[1] % group or w[0] != x[1]:
        raise ValueError(f"ConvTranspose channels: X {x}, W {w} (C, M/group, k...), group {group}")
    m = w[1] * group
    if len(ins) == 3 and ins[2].shape != (m,):
        raise ValueError(f"ConvTranspose bias must have shape ({m},), got {ins[2].shape}")
    spatial = len(x) - 2
    strides, pads, dil, extra = conv_transpose_attrs(attrs, spatial)
    out = [x[0], m]
    for i in range(spatial):
        size = strides[i] * (x[2 + i] - 1) + extra[i] + dil[i] * (w[2 + i] - 1) + 1 - pads[i] - pads[spatial + i]
        if size < 1:
            raise ValueError(f"ConvTranspose output axis {i} would have size {size}")
        out.append(size)
    return [(tuple(out), result_dtype(ins[:2]))]


def _conv_transpose_ref(attrs: Mapping[str, Any], x: np.ndarray, w: np.ndarray, *bias: np.ndarray) -> tuple:
    """Scatter every tap's product into the full output, then cut the pads off."""
    group = int(attrs.get("group", 1))
    spatial = x.ndim - 2
    strides, pads, dil, extra = conv_transpose_attrs(attrs, spatial)
    n, c = x.shape[:2]
    cg, mg = c // group, w.shape[1]
    dtype = np.result_type(x.dtype, w.dtype)
    ins = x.shape[2:]
    full = [strides[i] * (ins[i] - 1) + dil[i] * (w.shape[2 + i] - 1) + 1 + extra[i] for i in range(spatial)]
    y = np.zeros((n, group * mg, *full), dtype=dtype)
    letters = "hw"[:spatial]
    for g in range(group):
        xg = x[:, g * cg : (g + 1) * cg]
        wg = w[g * cg : (g + 1) * cg]
        for tap in np.ndindex(*w.shape[2:]):
            part = np.einsum(f"nc{letters},cm->nm{letters}", xg, wg[(slice(None), slice(None), *tap)])
            where = tuple(
                slice(tap[i] * dil[i], tap[i] * dil[i] + strides[i] * (ins[i] - 1) + 1, strides[i])
                for i in range(spatial)
            )
            y[(slice(None), slice(g * mg, (g + 1) * mg), *where)] += part
    out = y[(slice(None), slice(None), *(slice(pads[i], full[i] - pads[spatial + i]) for i in range(spatial)))]
    if bias:
        out = out + bias[0].reshape((group * mg,) + (1,) * spatial)
    return (np.ascontiguousarray(out.astype(dtype, copy=False)),)


# ---- the catalogue -------------------------------------------------------------------------------
_register(
    OpDef(
        "GatherND", "layout", _gather_nd, _gather_nd_ref, 2, attrs={"batch_dims": 0},
        doc="data[indices[..., :]] over the leading axes after batch_dims; negative indices count from the end",
    )
)
_register(
    OpDef(
        "GatherElements", "layout", _gather_elements, _gather_elements_ref, 2, attrs={"axis": 0},
        doc="out[..., i, ...] = data[..., indices[..., i, ...], ...] along axis (torch.gather)",
    )
)
_register(
    OpDef(
        "ScatterND", "layout", _scatter_nd, _scatter_nd_ref, 3, attrs={"reduction": "none"},
        doc="a copy of data with updates written (or added, multiplied, maxed, mined) at indices, in order",
    )
)
_register(
    OpDef(
        "CumSum", "layout", _cumsum, _cumsum_ref, 1, attrs={"axis": 0, "exclusive": 0, "reverse": 0},
        doc="running sum along axis (exclusive: of the elements before; reverse: from the end)",
    )
)
_register(
    OpDef(
        "Trilu", "layout", _trilu, _trilu_ref, 1, attrs={"upper": 1, "k": 0},
        doc="upper (or lower) triangle of the last two axes from diagonal k, zeros elsewhere",
    )
)
_register(
    OpDef("Tile", "layout", _tile, _tile_ref, 1, attrs={"repeats": ()}, doc="np.tile with one repeat count per axis")
)
_register(
    OpDef(
        "Pad", "layout", _pad, _pad_ref, 1, attrs={"pads": (), "mode": "constant", "value": 0.0},
        doc="pad [begin..., end...] with a constant, a reflection, the edge or a wrap; negative pads crop",
    )
)
_register(
    OpDef(
        "ConvTranspose", "contraction", _conv_transpose, _conv_transpose_ref, (2, 3),
        attrs={"strides": (), "pads": (), "dilations": (), "group": 1, "output_padding": ()},
        doc="ONNX ConvTranspose (N, C, spatial...) with W (C, M/group, k...), optional bias (M,); explicit pads",
    )
)
