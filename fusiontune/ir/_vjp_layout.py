"""Vector-Jacobian rules of the layout and index ops.

Data movement runs backwards as the opposite movement: Reshape back, the inverse permutation,
Slice of a Concat, Concat of a Split, Pad of a Slice. Every gather runs backwards as a
scatter-add (ScatterND with ``reduction="add"``, which sums repeated indices) onto zeros:
:func:`scatter_add_axis` is the gradient of ``Gather`` and also of a Pad in reflect / edge / wrap
mode (a gather along each axis with a fixed index map) and of a strided Slice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusiontune.ir._ops_index import pad_geometry
from fusiontune.ir.autodiff import VjpContext, mask, reshape, scalar, sum_to, vjp, zeros
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Shape
from fusiontune.ir.ops import normalize_axis, slice_index


def scatter_add_axis(b: GraphBuilder, g: Tensor, index: Tensor, axis: int, size: int) -> Tensor:
    """The gradient of ``Gather(data, index, axis)`` for data with ``size`` entries on ``axis``.

    ``g`` has Gather's output shape ``data.shape[:axis] + index.shape + data.shape[axis + 1:]``;
    the result has data's shape: every entry of ``g`` added at the position its index names.
    """
    q = len(index.shape)
    rank = len(g.shape) - q + 1
    outer = list(range(axis)) + list(range(axis + q, len(g.shape)))
    moved = g if axis == 0 else b.transpose(g, (*range(axis, axis + q), *outer))
    rest = tuple(g.shape[i] for i in outer)
    where = reshape(b, index, (*index.shape, 1))
    out = b.op("ScatterND", zeros(b, (size, *rest), g.dtype), where, moved, reduction="add")
    if axis == 0:
        return out
    return b.transpose(out, (*range(1, axis + 1), 0, *range(axis + 1, rank)))


def index_const(b: GraphBuilder, positions: np.ndarray, dtype: str = "int64") -> Tensor:
    return b.const(np.asarray(positions, dtype=dtype), dtype=dtype)


@vjp("Reshape")
def _reshape(c: VjpContext) -> Sequence[Tensor | None]:
    return [reshape(c.b, c.g, c.x().shape)]


@vjp("Transpose")
def _transpose(c: VjpContext) -> Sequence[Tensor | None]:
    rank = len(c.x().shape)
    perm = tuple(c.attrs.get("perm") or reversed(range(rank)))
    return [c.b.transpose(c.g, tuple(int(i) for i in np.argsort(perm)))]


@vjp("Expand")
def _expand(c: VjpContext) -> Sequence[Tensor | None]:
    return [sum_to(c.b, c.g, c.x().shape)]


@vjp("Concat")
def _concat(c: VjpContext) -> Sequence[Tensor | None]:
    axis = normalize_axis(c.attrs["axis"], len(c.y().shape))
    out: list[Tensor | None] = []
    start = 0
    for x, need in zip(c.inputs, c.needs, strict=True):
        n = x.shape[axis]
        out.append(c.b.slice(c.g, [start], [start + n], [axis]) if need else None)
        start += n
    return out


@vjp("Split")
def _split(c: VjpContext) -> Sequence[Tensor | None]:
    axis = normalize_axis(c.attrs["axis"], len(c.x().shape))
    parts = [c.cot(i) for i in range(len(c.outputs))]
    return [parts[0] if len(parts) == 1 else c.b.concat(parts, axis)]


@vjp("Slice")
def _slice(c: VjpContext) -> Sequence[Tensor | None]:
    b, x = c.b, c.x()
    index = slice_index(c.attrs, x.shape)
    g = c.g
    pads_begin, pads_end = [0] * len(x.shape), [0] * len(x.shape)
    for axis, (n, sl) in enumerate(zip(x.shape, index, strict=True)):
        positions = np.arange(n)[sl]
        if len(positions) and np.all(np.diff(positions) == 1):  # a contiguous run: pad it back
            pads_begin[axis], pads_end[axis] = int(positions[0]), int(n - 1 - positions[-1])
        elif len(positions) == 0:
            pads_begin[axis] = n
        elif len(positions) != n or np.any(positions != np.arange(n)):
            g = scatter_add_axis(b, g, index_const(b, positions), axis, n)
    if any(pads_begin) or any(pads_end):
        g = b.op("Pad", g, pads=(*pads_begin, *pads_end), mode="constant")
    return [g]


@vjp("Tile")
def _tile(c: VjpContext) -> Sequence[Tensor | None]:
    # the copies of x add up: view g as (r0, d0, r1, d1, ...) and sum the r axes
    b, x = c.b, c.x()
    reps = tuple(int(r) for r in c.attrs["repeats"])
    if not reps or all(r == 1 for r in reps):
        return [reshape(b, c.g, x.shape)]
    split = tuple(v for r, d in zip(reps, x.shape, strict=True) for v in (r, d))
    summed = b.reduce_sum(reshape(b, c.g, split), tuple(range(0, 2 * len(reps), 2)), keepdims=False)
    return [reshape(b, summed, x.shape)]


@vjp("Trilu")
def _trilu(c: VjpContext) -> Sequence[Tensor | None]:
    return [c.b.op("Trilu", c.g, upper=c.attrs["upper"], k=c.attrs["k"])]


@vjp("CumSum")
def _cumsum(c: VjpContext) -> Sequence[Tensor | None]:
    # the transpose of a running sum is the running sum the other way round
    return [
        c.b.op(
            "CumSum",
            c.g,
            axis=c.attrs["axis"],
            exclusive=c.attrs["exclusive"],
            reverse=0 if int(c.attrs["reverse"]) else 1,
        )
    ]


@vjp("Pad")
def _pad(c: VjpContext) -> Sequence[Tensor | None]:
    b, x = c.b, c.x()
    geo = pad_geometry(c.attrs["pads"], x.shape)
    mode = c.attrs.get("mode", "constant")
    g = c.g
    if mode == "constant":
        # the kept part of x sits at [begin, begin + kept) of the output; cropped parts get zero
        g = b.slice(
            g, [p for p, _, _, _ in geo], [p + n for p, _, n, _ in geo], list(range(len(geo)))
        )
    else:
        for axis, (p, crop, n, e) in enumerate(geo):
            source = np.pad(np.arange(crop, crop + n), (p, e), mode=mode)
            if p or e:
                g = scatter_add_axis(b, g, index_const(b, source), axis, x.shape[axis])
            elif crop or n != x.shape[axis]:
                g = b.op("Pad", g, pads=_crop_pads(geo, axis, x.shape), mode="constant")
        return [g]
    if any(crop or n != size for (_, crop, n, _), size in zip(geo, x.shape, strict=True)):
        begins = [crop for _, crop, _, _ in geo]
        ends = [size - crop - n for (_, crop, n, _), size in zip(geo, x.shape, strict=True)]
        g = b.op("Pad", g, pads=(*begins, *ends), mode="constant")
    return [g]


def _crop_pads(geo: list[tuple[int, int, int, int]], axis: int, shape: Shape) -> tuple[int, ...]:
    """Zero pads that put back what a negative pad cropped from ``axis`` only."""
    begins, ends = [0] * len(shape), [0] * len(shape)
    _, crop, n, _ = geo[axis]
    begins[axis], ends[axis] = crop, shape[axis] - crop - n
    return (*begins, *ends)


@vjp("Gather")
def _gather(c: VjpContext) -> Sequence[Tensor | None]:
    data, idx = c.inputs
    axis = normalize_axis(c.attrs.get("axis", 0), len(data.shape))
    return [scatter_add_axis(c.b, c.g, idx, axis, data.shape[axis]), None]


def _batch_coords(b: GraphBuilder, idx: Tensor, batch_dims: int) -> Tensor:
    """``idx`` (..., m) with the batch coordinates of each row put first: (..., batch_dims + m)."""
    rows = idx.shape[:-1]
    grid = np.indices(rows[:batch_dims]).reshape(
        batch_dims, *rows[:batch_dims], *(1,) * (len(rows) - batch_dims)
    )
    coords = np.moveaxis(np.broadcast_to(grid, (batch_dims, *rows)), 0, -1)
    return b.concat([index_const(b, coords, idx.dtype), idx], -1)


@vjp("GatherND")
def _gather_nd(c: VjpContext) -> Sequence[Tensor | None]:
    b, (data, idx) = c.b, c.inputs
    batch_dims = int(c.attrs.get("batch_dims", 0))
    if batch_dims:  # ScatterND counts a negative index from the end of its axis, as GatherND does
        idx = _batch_coords(b, idx, batch_dims)
    return [b.op("ScatterND", zeros(b, data.shape, c.g.dtype), idx, c.g, reduction="add"), None]


@vjp("GatherElements")
def _gather_elements(c: VjpContext) -> Sequence[Tensor | None]:
    b, (data, idx) = c.b, c.inputs
    axis = normalize_axis(c.attrs.get("axis", 0), len(data.shape))
    grid = np.indices(idx.shape)
    coords = [
        reshape(b, idx, (*idx.shape, 1))
        if k == axis
        else index_const(b, grid[k][..., None], idx.dtype)
        for k in range(len(idx.shape))
    ]
    where = coords[0] if len(coords) == 1 else b.concat(coords, -1)
    return [b.op("ScatterND", zeros(b, data.shape, c.g.dtype), where, c.g, reduction="add"), None]


@vjp("ScatterND")
def _scatter_nd(c: VjpContext) -> Sequence[Tensor | None]:
    b, (data, idx, upd) = c.b, c.inputs
    g, y = c.g, c.y()
    reduction = c.attrs.get("reduction", "none")
    m = idx.shape[-1]
    rows = idx.shape[:-1]
    tail = (1,) * (len(data.shape) - m)  # an update row's trailing axes, for broadcasting
    if reduction == "add":
        return [g, None, b.op("GatherND", g, idx)]
    if reduction == "none":
        # data keeps the gradient where nothing was written; of repeated indices the last update
        # won, and only it gets a gradient: write each update's number, read back who won.
        d_data = b.op("ScatterND", g, idx, zeros(b, upd.shape, g.dtype))
        number = index_const(b, np.arange(int(np.prod(rows, dtype=np.int64))).reshape(rows))
        board = b.op(
            "ScatterND", b.expand(index_const(b, np.asarray(-1)), data.shape[:m]), idx, number
        )
        won = mask(b, b.equal(b.op("GatherND", board, idx), number), g.dtype)
        return [d_data, None, b.mul(b.op("GatherND", g, idx), reshape(b, won, (*rows, *tail)))]
    if reduction == "mul":
        # y = data * prod(updates at the position): each factor's gradient is g * y / factor
        prod = b.op(
            "ScatterND", b.expand(scalar(b, 1.0, g.dtype), data.shape), idx, upd, reduction="mul"
        )
        return [b.mul(g, prod), None, b.div(b.op("GatherND", b.mul(g, y), idx), upd)]
    # max / min: y is one of data and the updates at the position; the ones equal to it share g
    data_hit = mask(b, b.equal(data, y), g.dtype)
    upd_hit = mask(b, b.equal(upd, b.op("GatherND", y, idx)), g.dtype)
    count = b.op("ScatterND", data_hit, idx, upd_hit, reduction="add")
    share = b.div(g, count)
    return [b.mul(share, data_hit), None, b.mul(b.op("GatherND", share, idx), upd_hit)]
