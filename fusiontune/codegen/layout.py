"""Layout kernels: Reshape, Transpose, Concat, Split, Slice and Gather, each a copy loop of its own.

A kernel runs its outermost loop as a ``prange`` when it moves at least
:data:`~fusiontune.codegen.common.PARALLEL_MIN_ELEMENTS` elements and that loop has more than one
iteration. A parallel loop of one (a batch-1 Concat along the channels, an embedding lookup)
would still pay a parallel region's entry on every call, and numba compiles a parallel kernel in
about 3.4 times the time of the same kernel serial.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusiontune.codegen.common import (
    HEADER,
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    NotFusable,
    decorator,
)
from fusiontune.codegen.index import generate_index_kernel
from fusiontune.codegen.rules import INDEX_OPS
from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import normalize_axis, slice_index


def _loops(shape: Sequence[int], parallel: bool, indent: str = "    ") -> tuple[list[str], str, list[str]]:
    """Nested loops over ``shape`` (outermost parallel); returns lines, body indent, index vars."""
    lines: list[str] = []
    names = [f"i{k}" for k in range(len(shape))]
    for k, d in enumerate(shape):
        rng = "numba.prange" if (k == 0 and parallel) else "range"
        lines.append(f"{indent}for {names[k]} in {rng}({d}):")
        indent += "    "
    return lines, indent, names


def generate_layout_kernel(node: Node, values: dict[str, Value], name: str) -> KernelSource:
    """One data-movement kernel for a layout node.

    Raises:
        NotFusable: ``node`` is not a layout op.
    """
    if node.op in INDEX_OPS:  # the index ops of real exports: codegen/index.py
        return generate_index_kernel(node, values, name)
    ins = [values[i] for i in node.inputs]
    outs = [values[o] for o in node.outputs]
    total = sum(v.size for v in outs)
    par = total >= PARALLEL_MIN_ELEMENTS
    body: list[str] = []
    if node.op == "Reshape":
        args = [ArgSpec(ins[0].name, (ins[0].size,), ins[0].dtype, "in"), ArgSpec(outs[0].name, (outs[0].size,), outs[0].dtype, "out")]
        loops, ind, iv = _loops((outs[0].size,), par)
        body = loops + [f"{ind}a1[{iv[0]}] = a0[{iv[0]}]"]
    elif node.op == "Transpose":
        x, y = ins[0], outs[0]
        perm = node.attr("perm") or tuple(reversed(range(len(x.shape))))
        args = [ArgSpec(x.name, x.shape, x.dtype, "in"), ArgSpec(y.name, y.shape, y.dtype, "out")]
        par = par and y.shape[0] > 1  # the prange is the outermost loop: one task runs serial
        loops, ind, iv = _loops(y.shape, par)
        src = [""] * len(perm)
        for k, p in enumerate(perm):
            src[p] = iv[k]
        body = loops + [f"{ind}a1[{', '.join(iv)}] = a0[{', '.join(src)}]"]
    elif node.op in ("Concat", "Split"):
        whole = outs[0] if node.op == "Concat" else ins[0]
        parts = ins if node.op == "Concat" else outs
        axis = normalize_axis(node.attr("axis"), len(whole.shape))
        outer = int(np.prod(whole.shape[:axis]))
        inner = int(np.prod(whole.shape[axis + 1 :]))
        # Each part is one contiguous run per outer index (its channels by the inner positions),
        # so the copy is one flat loop per part and outer index. As a loop over the part's
        # channels around one over the inner positions, each channel's plane ended in a scalar
        # remainder: one thread, the kernel alone, interleaved, batch 2, two parts of C @HxW:
        # 16 @15 1.15x faster, 32 @7 1.69x, 48 @3 1.98x, 64 @3 1.96x; larger planes 1.0x-1.1x.
        whole_spec = ArgSpec(whole.name, (outer, whole.shape[axis] * inner), whole.dtype,
                             "out" if node.op == "Concat" else "in")
        part_specs = [
            ArgSpec(p.name, (outer, p.shape[axis] * inner), p.dtype, "in" if node.op == "Concat" else "out")
            for p in parts
        ]
        args = part_specs + [whole_spec] if node.op == "Concat" else [whole_spec] + part_specs
        w = f"a{args.index(whole_spec)}"
        par = par and outer > 1  # batch 1 along the channels: one task, run serial
        rng = "numba.prange" if par else "range"
        body = [f"    for o in {rng}({outer}):"]
        off = 0
        for spec in part_specs:
            p = f"a{args.index(spec)}"
            run = spec.shape[1]
            body.append(f"        for i in range({run}):")
            if node.op == "Concat":
                body.append(f"            {w}[o, {off} + i] = {p}[o, i]")
            else:
                body.append(f"            {p}[o, i] = {w}[o, {off} + i]")
            off += run
    elif node.op == "Slice":
        x, y = ins[0], outs[0]
        index = slice_index({**node.attrs}, x.shape)
        args = [ArgSpec(x.name, x.shape, x.dtype, "in"), ArgSpec(y.name, y.shape, y.dtype, "out")]
        par = par and y.shape[0] > 1
        loops, ind, iv = _loops(y.shape, par)
        src = []
        for k, (sl, d) in enumerate(zip(index, x.shape, strict=True)):
            start, _, step = sl.indices(d)
            src.append(f"{start} + {step} * {iv[k]}" if (start, step) != (0, 1) else iv[k])
        body = loops + [f"{ind}a1[{', '.join(iv)}] = a0[{', '.join(src)}]"]
    elif node.op == "Gather":
        args, body, par = _gather(node, ins, outs[0], par)
    else:
        raise NotFusable(f"{node.op} is not a layout op")
    if any(0 in a.shape for a in args):
        body = ["    return"]
    lines = [decorator(args, parallel=par, reassoc=False), f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}):", *body]
    nbytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in args)
    return KernelSource(name, HEADER + "\n".join(lines) + "\n", tuple(args), "layout", nbytes, 0)


def _gather(node: Node, ins: list[Value], out: Value, par: bool) -> tuple[list[ArgSpec], list[str], bool]:
    """``take(data, idx, axis)``: data viewed as (outer, n, inner), the indices flat, the output as
    (outer, m, inner). Indices are checked once, before the copy, as the reference checks them;
    a negative index counts from the end. Returns the arguments, the body, and whether it runs in
    parallel: over ``outer``, so an embedding lookup (axis 0, one outer index) runs serial."""
    data, idx = ins
    axis = normalize_axis(node.attr("axis", 0), len(data.shape))
    outer = int(np.prod(data.shape[:axis]))
    n = data.shape[axis]
    inner = int(np.prod(data.shape[axis + 1 :]))
    m = idx.size
    args = [
        ArgSpec(data.name, (outer, n, inner), data.dtype, "in"),
        ArgSpec(idx.name, (m,), idx.dtype, "in"),
        ArgSpec(out.name, (outer, m, inner), out.dtype, "out"),
    ]
    par = par and outer > 1
    rng = "numba.prange" if par else "range"
    body = [
        f"    for t in range({m}):",
        f"        if a1[t] < -{n} or a1[t] >= {n}:",
        '            raise IndexError("Gather index out of range")',
        f"    for o in {rng}({outer}):",
        f"        for t in range({m}):",
        "            j = a1[t]",
        "            if j < 0:",
        f"                j += {n}",
        f"            for i in range({inner}):",
        "                a2[o, t, i] = a0[o, j, i]",
    ]
    return args, body, par
