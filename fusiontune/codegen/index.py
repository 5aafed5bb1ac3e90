"""Kernels of the index and layout ops of real exports (ir/_ops_index.py), one node each.

Each kernel is a copy (or running-sum) loop nest over static shapes, its outermost loop a
``prange`` when the output is large (:data:`PARALLEL_MIN_ELEMENTS`):

* GatherND: data as (batch, positions, inner), indices as (batch, P, m); one task per gathered
  slice computes its flat position from the m coordinates and copies ``inner`` elements.
* GatherElements: one loop per axis of the indices, the index replacing the coordinate on ``axis``.
* ScatterND: the data copied in parallel, then the updates applied in index order (ONNX's
  sequential semantics, so a repeated index keeps its last update, or accumulates them all);
  with wide slices, tasks own column chunks of every slice, which keeps the order per element.
* CumSum: (outer, n, inner); a task owns a chunk of ``inner`` columns of one ``outer`` row and
  runs down ``n`` in numpy's order (the output is its accumulator), so the sums are bit-identical
  to ``np.cumsum`` in the same dtype.
* Trilu: (batch, rows, cols); per row, zeros up to (or from) the diagonal and a copy of the rest.
* Tile: a loop per output axis reading coordinate ``i % d``; the last axis as repeat x copy.
* Pad: ``constant`` writes each output row as begin fill, copy, end fill (rows outside the input
  are all fill); ``edge``, ``reflect`` and ``wrap`` map each output coordinate to its source.

Indices are checked before anything is written, as the reference checks them: an index outside
``[-n, n)`` raises ``IndexError``; a negative one counts from the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fusiontune.codegen.common import (
    HEADER,
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    NotFusable,
    decorator,
)
from fusiontune.codegen.rules import INDEX_OPS, literal
from fusiontune.ir._ops_index import pad_geometry
from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import get_op, normalize_axis

COLUMN_CHUNK = 4096
"""Columns a CumSum / ScatterND task owns when its rows are wide (one task per chunk)."""

Body = tuple[list[ArgSpec], list[str]]


def _prod(dims: Sequence[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


def _rng(parallel: bool) -> str:
    return "numba.prange" if parallel else "range"


def _strides(dims: Sequence[int]) -> list[int]:
    out, s = [], 1
    for d in reversed(dims):
        out.append(s)
        s *= d
    return out[::-1]


def _check_index(expr: str, n: int | str, op: str, indent: str) -> list[str]:
    return [
        f"{indent}if {expr} < -{n} or {expr} >= {n}:",
        f'{indent}    raise IndexError("{op} index out of range")',
    ]


def generate_index_kernel(node: Node, values: dict[str, Value], name: str) -> KernelSource:
    """One kernel for an index / layout node of ``rules.INDEX_OPS``.

    Raises:
        NotFusable: another op.
    """
    if node.op not in INDEX_OPS:
        raise NotFusable(f"{node.op} is not an index op")
    ins = [values[i] for i in node.inputs]
    out = values[node.outputs[0]]
    attrs = {**get_op(node.op).attrs, **node.attrs}
    par = out.size >= PARALLEL_MIN_ELEMENTS
    gen: Callable[..., Body] = _GENERATORS[node.op]
    args, body = gen(attrs, ins, out, par)
    if any(0 in a.shape for a in args if a.role == "out"):
        body = ["    return"]
    lines = [decorator(args, parallel=par, reassoc=False), f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}):", *body]
    nbytes = sum(_prod(a.shape) * np.dtype(a.dtype).itemsize for a in args)
    flops = out.size if node.op == "CumSum" else 0
    return KernelSource(name, HEADER + "\n".join(lines) + "\n", tuple(args), "layout", nbytes, flops)


# ---- gathers and scatters ------------------------------------------------------------------------
def _flat_position(idx: str, dims: Sequence[int], indent: str) -> list[str]:
    """Statements setting ``pos``: the flat position of the coordinates ``idx[..., k]`` in
    ``dims``, each counted from the end when negative."""
    lines = [f"{indent}pos = 0"]
    for k, (d, s) in enumerate(zip(dims, _strides(dims), strict=True)):
        lines += [
            f"{indent}j = {idx}{k}]",
            f"{indent}if j < 0:",
            f"{indent}    j += {d}",
            f"{indent}pos += j * {s}" if s != 1 else f"{indent}pos += j",
        ]
    return lines


def _gather_nd(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    data, idx = ins
    b = int(attrs.get("batch_dims", 0))
    m = idx.shape[-1]
    dims = data.shape[b : b + m]
    batch, inner = _prod(data.shape[:b]), _prod(data.shape[b + m :])
    p = _prod(idx.shape[b:-1])
    args = [
        ArgSpec(data.name, (batch, _prod(dims), inner), data.dtype, "in"),
        ArgSpec(idx.name, (batch, p, m), idx.dtype, "in"),
        ArgSpec(out.name, (batch, p, inner), out.dtype, "out"),
    ]
    body = [f"    for bi in range({batch}):", f"        for t in range({p}):"]
    for k, d in enumerate(dims):
        body += _check_index(f"a1[bi, t, {k}]", d, "GatherND", "            ")
    body += [f"    for u in {_rng(par)}({batch * p}):", f"        bi = u // {p}", f"        t = u % {p}"]
    body += _flat_position("a1[bi, t, ", dims, "        ")
    body += [f"        for i in range({inner}):", "            a2[bi, t, i] = a0[bi, pos, i]"]
    return args, body


def _gather_elements(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    data, idx = ins
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape))
    n = data.shape[axis]
    args = [
        ArgSpec(data.name, data.shape, data.dtype, "in"),
        ArgSpec(idx.name, idx.shape, idx.dtype, "in"),
        ArgSpec(out.name, out.shape, out.dtype, "out"),
    ]
    iv = [f"i{k}" for k in range(len(idx.shape))]
    at = ", ".join(iv)
    src = ", ".join("j" if k == axis else v for k, v in enumerate(iv))
    body: list[str] = []
    for phase in ("check", "copy"):
        ind = "    "
        for k, d in enumerate(idx.shape):
            rng = _rng(par and phase == "copy" and k == 0)
            body.append(f"{ind}for {iv[k]} in {rng}({d}):")
            ind += "    "
        if phase == "check":
            body += _check_index(f"a1[{at}]", n, "GatherElements", ind)
        else:
            body += [f"{ind}j = a1[{at}]", f"{ind}if j < 0:", f"{ind}    j += {n}", f"{ind}a2[{at}] = a0[{src}]"]
    return args, body


_SCATTER_UPDATE = {
    "none": "{o} = {u}",
    "add": "{o} = {o} + {u}",
    "mul": "{o} = {o} * {u}",
    "max": "{o} = np.maximum({o}, {u})",
    "min": "{o} = np.minimum({o}, {u})",
}


def _scatter_nd(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    data, idx, upd = ins
    m = idx.shape[-1]
    dims = data.shape[:m]
    s, inner = _prod(dims), _prod(data.shape[m:])
    p = _prod(idx.shape[:-1])
    args = [
        ArgSpec(data.name, (s, inner), data.dtype, "in"),
        ArgSpec(idx.name, (p, m), idx.dtype, "in"),
        ArgSpec(upd.name, (p, inner), upd.dtype, "in"),
        ArgSpec(out.name, (s, inner), out.dtype, "out"),
    ]
    body = [f"    for t in range({p}):"]
    for k, d in enumerate(dims):
        body += _check_index(f"a1[t, {k}]", d, "ScatterND", "        ")
    body += [f"    for r in {_rng(par)}({s}):", f"        for i in range({inner}):", "            a3[r, i] = a0[r, i]"]
    update = _SCATTER_UPDATE[attrs.get("reduction", "none")].format(o="a3[pos, i]", u="a2[t, i]")
    # Updates in index order. Wide slices: each task owns a chunk of columns of every slice, so
    # the order per element is still the index order.
    chunk = min(inner, COLUMN_CHUNK)
    nchunks = -(-inner // chunk) if inner else 0
    wide = par and nchunks > 1
    body += [f"    for c in {_rng(wide)}({nchunks}):", f"        c0 = c * {chunk}", f"        c1 = min(c0 + {chunk}, {inner})"]
    body += [f"        for t in range({p}):"]
    body += _flat_position("a1[t, ", dims, "            ")
    body += ["            for i in range(c0, c1):", f"                {update}"]
    return args, body


# ---- running sums and masks ----------------------------------------------------------------------
def _cumsum(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    x = ins[0]
    axis = normalize_axis(int(attrs.get("axis", 0)), len(x.shape))
    outer, n, inner = _prod(x.shape[:axis]), x.shape[axis], _prod(x.shape[axis + 1 :])
    args = [ArgSpec(x.name, (outer, n, inner), x.dtype, "in"), ArgSpec(out.name, (outer, n, inner), out.dtype, "out")]
    chunk = max(min(inner, COLUMN_CHUNK), 1)
    nchunks = -(-inner // chunk)
    reverse, exclusive = bool(attrs.get("reverse", 0)), bool(attrs.get("exclusive", 0))
    first, prev = (n - 1, "t + 1") if reverse else (0, "t - 1")
    zero = literal(0, x.dtype)
    body = [
        f"    for u in {_rng(par)}({outer * nchunks}):",
        f"        o = u // {nchunks}",
        f"        c0 = (u % {nchunks}) * {chunk}",
        f"        c1 = min(c0 + {chunk}, {inner})",
        "        for i in range(c0, c1):",
        f"            a1[o, {first}, i] = {zero if exclusive else f'a0[o, {first}, i]'}",
        f"        for s in range(1, {n}):",
        f"            t = {f'{n - 1} - s' if reverse else 's'}",
        "            for i in range(c0, c1):",
        # exclusive: the previous position's sum plus the previous element
        f"                a1[o, t, i] = a1[o, {prev}, i] + a0[o, {prev if exclusive else 't'}, i]",
    ]
    return args, body


def _trilu(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    x = ins[0]
    rows, cols = x.shape[-2:]
    batch = _prod(x.shape[:-2])
    args = [ArgSpec(x.name, (batch, rows, cols), x.dtype, "in"), ArgSpec(out.name, (batch, rows, cols), out.dtype, "out")]
    k = int(attrs.get("k", 0))
    zero = literal(0, x.dtype)
    upper = bool(attrs.get("upper", 1))
    # upper keeps columns j >= r + k, lower keeps j <= r + k: the cut is the first column of the
    # second part.
    cut = f"r + {k}" if upper else f"r + {k + 1}"
    first, second = (zero, "a0[b, r, j]") if upper else ("a0[b, r, j]", zero)
    body = [
        f"    for u in {_rng(par)}({batch * rows}):",
        f"        b = u // {rows}",
        f"        r = u % {rows}",
        f"        cut = min(max({cut}, 0), {cols})",
        "        for j in range(cut):",
        f"            a1[b, r, j] = {first}",
        f"        for j in range(cut, {cols}):",
        f"            a1[b, r, j] = {second}",
    ]
    return args, body


# ---- tiles and pads ------------------------------------------------------------------------------
def _tile(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    x = ins[0]
    reps = tuple(int(r) for r in attrs["repeats"])
    args = [ArgSpec(x.name, x.shape or (1,), x.dtype, "in"), ArgSpec(out.name, out.shape or (1,), out.dtype, "out")]
    if not x.shape:
        return args, ["    a1[0] = a0[0]"]
    r = len(x.shape)
    body: list[str] = []
    ind = "    "
    for k in range(r - 1):
        body.append(f"{ind}for i{k} in {_rng(par and k == 0)}({out.shape[k]}):")
        ind += "    "
        body.append(f"{ind}s{k} = i{k} % {x.shape[k]}" if reps[k] != 1 else f"{ind}s{k} = i{k}")
    d = x.shape[-1]
    pre_o = "".join(f"i{k}, " for k in range(r - 1))
    pre_s = "".join(f"s{k}, " for k in range(r - 1))
    body += [
        f"{ind}for t in {_rng(par and r == 1)}({reps[-1]}):",
        f"{ind}    for j in range({d}):",
        f"{ind}        a1[{pre_o}t * {d} + j] = a0[{pre_s}j]",
    ]
    return args, body


def _pad_source(mode: str, i: str, geo: tuple[int, int, int, int]) -> str:
    """The input coordinate that output coordinate ``i`` reads under ``mode`` (not ``constant``),
    on an axis of :func:`pad_geometry` ``(begin, crop, kept, end)``."""
    begin, crop, kept, end = geo
    j = f"({i} - {begin})" if begin else i
    if not begin and not end:
        src = j
    elif mode == "edge":
        src = f"min(max({j}, 0), {kept - 1})"
    elif mode == "wrap":
        src = f"{j} % {kept}"
    elif kept == 1:  # reflect over one element: the element itself
        src = "0"
    else:
        period = 2 * (kept - 1)
        folded = f"abs({j}) % {period}"
        src = f"({period} - {folded} if {folded} >= {kept} else {folded})"
    return f"{src} + {crop}" if crop else src


def _pad(attrs: dict, ins: list[Value], out: Value, par: bool) -> Body:
    x = ins[0]
    mode = attrs.get("mode", "constant")
    geo = pad_geometry(attrs["pads"], x.shape)
    args = [ArgSpec(x.name, x.shape or (1,), x.dtype, "in"), ArgSpec(out.name, out.shape or (1,), out.dtype, "out")]
    r = len(x.shape)
    if r == 0:
        return args, ["    a1[0] = a0[0]"]
    body: list[str] = []
    ind = "    "
    for k in range(r - 1):
        begin, crop, kept, _ = geo[k]
        body.append(f"{ind}for i{k} in {_rng(par and k == 0)}({out.shape[k]}):")
        ind += "    "
        if mode == "constant":
            inside = f"{begin} <= i{k} < {begin + kept}"
            body.append(f"{ind}in{k} = {inside}" if k == 0 else f"{ind}in{k} = in{k - 1} and {inside}")
            body.append(f"{ind}s{k} = i{k} - {begin - crop}")
        else:
            body.append(f"{ind}s{k} = {_pad_source(mode, f'i{k}', geo[k])}")
    pre_o = "".join(f"i{k}, " for k in range(r - 1))
    pre_s = "".join(f"s{k}, " for k in range(r - 1))
    begin, crop, kept, end = geo[-1]
    width = out.shape[-1]
    if mode != "constant":
        src = _pad_source(mode, "j", geo[-1])
        body += [f"{ind}for j in {_rng(par and r == 1)}({width}):", f"{ind}    a1[{pre_o}j] = a0[{pre_s}{src}]"]
        return args, body
    value = literal(attrs.get("value", 0.0), x.dtype)
    row = [
        f"for j in range({begin}):",
        f"    a1[{pre_o}j] = {value}",
        f"for j in range({kept}):",
        f"    a1[{pre_o}{begin} + j] = a0[{pre_s}{crop} + j]",
        f"for j in range({begin + kept}, {width}):",
        f"    a1[{pre_o}j] = {value}",
    ]
    if r == 1:
        return args, [f"{ind}{line}" for line in row]
    body.append(f"{ind}if in{r - 2}:")
    body += [f"{ind}    {line}" for line in row]
    body += [f"{ind}else:", f"{ind}    for j in range({width}):", f"{ind}        a1[{pre_o}j] = {value}"]
    return args, body


_GENERATORS: dict[str, Callable[..., Body]] = {
    "GatherND": _gather_nd,
    "GatherElements": _gather_elements,
    "ScatterND": _scatter_nd,
    "CumSum": _cumsum,
    "Trilu": _trilu,
    "Tile": _tile,
    "Pad": _pad,
}
