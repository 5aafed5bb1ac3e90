"""Rotary position embedding kernels: ``y = x * cos + rotate(x) * sin``, one node each.

RotaryPositionEmbeddingFusionPass makes the node out of the exporters' ``Slice / Neg / Concat``,
two ``Mul`` and an ``Add``: five kernels, the rotated copy and two products written to memory and
read again. Here each output row is computed from one read of its ``x`` row. For mode 0 (the
halves of the last axis, GPT-NeoX / LLaMA ``rotate_half``), with ``h = D / 2`` and ``j < h``::

    y[j]     = x[j]     * cos[j]     - x[j + h] * sin[j]
    y[j + h] = x[j + h] * cos[j + h] + x[j]     * sin[j + h]

and for mode 1 (interleaved pairs) the same with ``2j`` and ``2j + 1``. ``a - b * s`` equals the
reference's ``a + (-b) * s`` exactly (a negation is exact), and the kernel sets no fast-math flag
(no fused multiply-add contraction), so it agrees with the interpreter bit for bit.

cos and sin broadcast to x (HF writes them as (B, 1, S, D) against (B, H, S, D)): a broadcast
axis is indexed at 0. The loop over x's leading axes is parallel on its outermost axis when the
tensor is large enough.
"""

from __future__ import annotations

import numpy as np

from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    NotFusable,
    decorator,
    kernel_header,
)
from fusiontune.ir.graph import Node, Value
from fusiontune.ir.ops import get_op


def generate_rotary_kernel(node: Node, values: dict[str, Value], name: str) -> KernelSource:
    """One kernel for a RotaryPositionEmbedding node.

    Raises:
        NotFusable: another op, or a dtype other than float32 / float64.
    """
    if node.op != "RotaryPositionEmbedding":
        raise NotFusable(f"{node.op} is not RotaryPositionEmbedding")
    x, cos, sin = (values[i] for i in node.inputs)
    y = values[node.outputs[0]]
    if x.dtype not in ("float32", "float64") or any(v.dtype != x.dtype for v in (cos, sin)):
        raise NotFusable("RotaryPositionEmbedding needs float32 or float64 x, cos and sin of one dtype")
    mode = int({**get_op(node.op).attrs, **node.attrs}["mode"])
    rank = len(x.shape)
    lead = x.shape[:-1]
    d = x.shape[-1]
    h = d // 2

    def padded(v: Value) -> tuple[int, ...]:
        return (1,) * (rank - len(v.shape)) + v.shape

    args = (
        ArgSpec(x.name, x.shape, x.dtype, "in"),
        ArgSpec(cos.name, padded(cos), cos.dtype, "in"),
        ArgSpec(sin.name, padded(sin), sin.dtype, "in"),
        ArgSpec(y.name, y.shape, y.dtype, "out"),
    )
    parallel = x.size >= PARALLEL_MIN_ELEMENTS and bool(lead) and lead[0] > 1
    iv = [f"i{k}" for k in range(rank - 1)]
    body: list[str] = []
    indent = "    "
    for k, n in enumerate(lead):
        rng = "numba.prange" if (k == 0 and parallel) else "range"
        body.append(f"{indent}for {iv[k]} in {rng}({n}):")
        indent += "    "

    def at(arr: str, shape: tuple[int, ...], j: str) -> str:
        index = [iv[k] if shape[k] > 1 else "0" for k in range(rank - 1)]
        return f"{arr}[{', '.join([*index, j])}]"

    xs, cs, ss, ys = (a.shape for a in args)
    lo, hi = ("j", f"j + {h}") if mode == 0 else ("2 * j", "2 * j + 1")
    body += [
        f"{indent}for j in range({h}):",
        f"{indent}    a = {at('a0', xs, lo)}",
        f"{indent}    b = {at('a0', xs, hi)}",
        f"{indent}    {at('a3', ys, lo)} = a * {at('a1', cs, lo)} - b * {at('a2', ss, lo)}",
        f"{indent}    {at('a3', ys, hi)} = b * {at('a1', cs, hi)} + a * {at('a2', ss, hi)}",
    ]
    if x.size == 0:
        body = ["    return"]
    lines = [
        decorator(args, parallel=parallel, reassoc=False),
        f"def {name}(a0, a1, a2, a3):",
        *body,
    ]
    source = kernel_header("\n".join(lines)) + "\n".join(lines) + "\n"
    itemsize = np.dtype(x.dtype).itemsize
    nbytes = (x.size + cos.size + sin.size + y.size) * itemsize
    return KernelSource(name, source, args, "rotary", nbytes, 3 * y.size)
