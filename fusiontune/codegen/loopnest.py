"""Loop-nest kernels: elementwise ops and reductions (with their prologue and epilogue) in one kernel.

The kernel's domain is the shape of the group's largest value. Its dims split into *outer* dims,
run by one flattened ``prange``, and *inner* dims, looped inside it: the reduced axes for a
reduction group, the last axis for an elementwise one. Adjacent dims of the same class that every
array broadcasts the same way are coalesced first, so a contiguous elementwise chain becomes one
flat loop that LLVM vectorizes.

Inside one outer iteration the kernel runs *rounds*. Round k is one pass over the inner dims that
accumulates every reduction of depth k (a reduction that reads the result of a depth-(k-1) one has
depth k) and stores every element-level output whose inputs are ready. Per-row values (the
reduction results and what is computed from them alone) are scalars between rounds. So Softmax is
three rounds (max; sum of exp; scale) and LayerNorm three (mean; variance; normalize) over data
that stays in cache, and an AddLayerNorm writes its sum in the first round.

Two schedule keys change the arithmetic, not the loops. ``math="approx"`` writes transcendentals
as the inlined approximations of codegen/numerics.py, so loops with an exp (Softmax's rounds
included) vectorize. ``precision="float16"|"bfloat16"`` emulates MindSpore's enable_low_precision:
every float value the kernel loads (inputs, scalar constants), computes (each node) and stores is
rounded to the low precision, held exactly in a float32 (a float64 kernel rounds through float32);
reductions accumulate in float32, as Ascend's vector units do, over rounded inputs, and their
results are rounded (a mean's 1/n scale belongs to the float32 reduction). Integer and bool values are left alone, and so are ops whose result is
already representable (max, min, negation, select: ``rules.EXACT_OPS``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    KernelSource,
    Lowered,
    NotFusable,
    align,
    decorator,
    kernel_header,
)
from fusiontune.codegen.rules import (
    EXACT_OPS,
    REDUCE_RULES,
    SCALAR_RULES,
    literal,
    round_expr,
    round_literal,
    scalar_expr,
)
from fusiontune.ir.graph import Node, Shape
from fusiontune.ir.ops import broadcast_shapes, get_op, normalize_axes

# Elementwise ops worth a store and a load rather than a recomputation (libm calls). With
# math="approx" the transcendentals are inlined vectorized polynomials, and still worth stashing:
# a float32 softmax reusing its stashed exp ran 1.9 ms (4096x1024) and 2.3 ms (512x8192) against
# 2.7 and 3.0 ms recomputing it (2 threads). The stash's store and reload hit cache; recomputing
# costs the subtraction and the whole polynomial again.
EXPENSIVE = frozenset({"Exp", "Log", "Tanh", "Erf", "Sigmoid", "Silu", "Gelu", "SwiGlu", "Pow"})


def plan_domain(low: Lowered, outputs: Sequence[str]) -> tuple[Shape, tuple[int, ...]]:
    """The kernel's domain and reduced axes; raise NotFusable when the group has no single one."""
    reductions = [n for n in low.nodes if n.op in REDUCE_RULES]
    for n in low.nodes:
        if n.op not in SCALAR_RULES and n.op not in REDUCE_RULES:
            raise NotFusable(f"{n.op} is not a loop-nest op")
    if reductions:
        dom = low.values[reductions[0].inputs[0]].shape
        axes = normalize_axes(reductions[0].attr("axes"), len(dom))
        for r in reductions[1:]:
            s = low.values[r.inputs[0]].shape
            if s != dom or normalize_axes(r.attr("axes"), len(s)) != axes:
                raise NotFusable(f"reductions over different domains: {dom}{axes} vs {s}")
    else:
        try:
            dom = broadcast_shapes(*(low.values[o].shape for o in outputs))
        except ValueError as exc:
            raise NotFusable(str(exc)) from None
        axes = ()
    rank = len(dom)
    produced_inside = {o for n in low.nodes for o in n.outputs}
    for n in low.nodes:
        for v in (*n.inputs, *n.outputs):
            shape = low.values[v].shape
            if len(shape) > rank or any(s not in (1, d) for s, d in zip(align(shape, rank), dom, strict=True)):
                if not (n.op in REDUCE_RULES and v in n.outputs and not n.attr("keepdims", True)):
                    raise NotFusable(f"{v} {shape} does not broadcast to the kernel domain {dom}")
        if n.op in REDUCE_RULES and not n.attr("keepdims", True):
            users = [m for m in low.nodes if n.outputs[0] in m.inputs]
            # Over leading axes only, the squeezed result broadcasts (numpy alignment) exactly
            # like the keepdims one: later ops may read it (a bias gradient's optimizer update).
            kept = tuple(1 if i in axes else d for i, d in enumerate(dom))
            if users and align(low.values[n.outputs[0]].shape, rank) != kept:
                raise NotFusable("a keepdims=False reduction can only end a kernel")
    reduced = tuple(1 if i in axes else d for i, d in enumerate(dom))
    for o in outputs:
        shape = low.values[o].shape
        prod = next(n for n in low.nodes if o in n.outputs)
        if prod.op in REDUCE_RULES and not prod.attr("keepdims", True):
            continue
        if shape != dom and not (axes and align(shape, rank) == reduced):
            raise NotFusable(f"output {o} {shape} is neither the domain {dom} nor its reduction")
        if o not in produced_inside:
            raise NotFusable(f"output {o} not produced in the group")
    return dom, axes


def _coalesce(dom: Shape, axes: tuple[int, ...], arrays: list[Shape]) -> tuple[list[list[int]], list[bool]]:
    """Merge adjacent same-class dims that every array broadcasts alike; drop size-1 dims."""
    keep = [i for i, d in enumerate(dom) if d != 1] or [len(dom) - 1]
    groups: list[list[int]] = []
    for i in keep:
        if groups:
            j = groups[-1][-1]
            same_class = (i in axes) == (j in axes)
            alike = all((a[i] == 1) == (a[j] == 1) for a in arrays)
            if same_class and alike and j == i - 1:
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups, [g[0] in axes for g in groups]


def generate_loop_kernel(
    low: Lowered,
    inputs: Sequence[str],
    outputs: Sequence[str],
    name: str,
    approx: bool = False,
    precision: str | None = None,
) -> KernelSource:
    """Generate the loop-nest kernel for a lowered group.

    Args:
        low: the group's primitive nodes and constants.
        inputs: external values read (graph inputs, other kernels' outputs, array constants).
        outputs: values the group must write.
        name: the function name.
        approx: write exp, tanh, erf (and the ops built on them) as numerics.py's approximations.
        precision: ``float16`` or ``bfloat16`` to round every float value to it (None: no rounding).

    Raises:
        NotFusable: the nodes do not form one loop nest.
    """
    dom, axes = plan_domain(low, outputs)
    if not dom:  # scalars: a one-element loop
        dom = (1,)
    rank = len(dom)
    aligned = {v: align(low.values[v].shape, rank) for v in (*inputs, *outputs) if len(low.values[v].shape) <= rank}
    for o in outputs:  # keepdims=False reduction outputs: view them with the reduced dims back
        if o not in aligned or len(low.values[o].shape) != rank:
            aligned[o] = tuple(1 if i in axes else d for i, d in enumerate(dom))
    groups, is_tail = _coalesce(dom, axes, list(aligned.values()))
    cdom = tuple(int(np.prod([dom[i] for i in g])) for g in groups)
    cshape = {v: tuple(int(np.prod([s[i] for i in g])) for g in groups) for v, s in aligned.items()}
    if axes:
        inner = [k for k, t in enumerate(is_tail) if t]
    else:
        inner = [len(cdom) - 1] if len(cdom) > 1 else []
    outer = [k for k in range(len(cdom)) if k not in inner]
    loop_var = {k: (f"j{k}" if k in inner else f"i{k}") for k in range(len(cdom))}

    def index(v: str) -> str:
        return "[" + ", ".join("0" if cshape[v][k] == 1 else loop_var[k] for k in range(len(cdom))) + "]"

    def varies_inner(v: str) -> bool:
        return any(cshape[v][k] != 1 for k in inner)

    args = [ArgSpec(v, cshape[v], low.values[v].dtype, "in") for v in inputs] + [
        ArgSpec(v, cshape[v], low.values[v].dtype, "out") for v in outputs
    ]
    arg_name = {a.value: f"a{i}" for i, a in enumerate(args)}

    # ---- levels and depths -----------------------------------------------------------------
    var: dict[str, str] = {}
    element: dict[str, bool] = {}
    depth: dict[str, int] = {}  # number of reduction rounds a value waits for
    for v in inputs:
        element[v] = varies_inner(v)
        depth[v] = 0
    for v in low.scalars:
        var[v] = literal(round_literal(low.scalars[v], precision, low.values[v].dtype), low.values[v].dtype)
        element[v] = False
        depth[v] = 0
    red_depth: dict[str, int] = {}
    for n in low.nodes:
        dep = max((depth[i] for i in n.inputs), default=0)
        if n.op in REDUCE_RULES:
            red_depth[n.name] = dep
            element[n.outputs[0]] = False
            depth[n.outputs[0]] = dep + 1
        else:
            element[n.outputs[0]] = any(element[i] for i in n.inputs)
            depth[n.outputs[0]] = dep
    for i, n in enumerate(low.nodes):
        var[n.outputs[0]] = f"v{i}"
    # An output is stored inside the loops when its buffer varies along the inner dims, even if
    # its value does not (an Expand of a per-row value).
    looped = {o: varies_inner(o) for o in outputs}
    rounds = 1 + max([d for d in red_depth.values()] + [depth[o] for o in outputs if looped[o]] + [0])

    producer = {n.outputs[0]: n for n in low.nodes}
    lines: list[str] = []
    out = lines.append

    def fenced(expr: str, dtype: str) -> str:
        # A per-row float value is computed once, outside the inner loops, and fenced: under
        # reassoc LLVM would sink a division into the loop (v * (1 / s) -> v / s, numerics.py's
        # arith_fence), one division per element instead of one per row. Without inner loops
        # the outer loop is the elementwise loop itself, and a fence there would keep it scalar.
        return f"arith_fence({expr})" if inner and dtype in ("float32", "float64") else expr

    def emit_node(n: Node, ind: str, per_row: bool = False) -> None:
        dtype = low.values[n.outputs[0]].dtype
        lit_dtype = dtype if dtype != "bool" else low.values[n.inputs[0]].dtype
        operands = [var[i] for i in n.inputs]
        if n.op == "Pow" and n.inputs[1] in low.scalars and low.scalars[n.inputs[1]] in (2.0, 3.0):
            # x*x (x*x*x) instead of pow(): a libm call per element for the commonest exponents.
            expr = " * ".join([operands[0]] * int(low.scalars[n.inputs[1]]))
        else:
            expr = scalar_expr(n.op, operands, {**get_op(n.op).attrs, **n.attrs}, lambda c: literal(c, lit_dtype), dtype, approx)
        if n.op not in EXACT_OPS:
            expr = round_expr(expr, precision, dtype)
        if per_row:
            expr = fenced(expr, dtype)
        out(f"{ind}{var[n.outputs[0]]} = {expr}")

    def load(v: str) -> str:
        return round_expr(f"{arg_name[v]}{index(v)}", precision, low.values[v].dtype)

    def element_closure(targets: list[str], leaves: set[str] = frozenset()) -> list[Node]:  # type: ignore[assignment]
        need: set[str] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            if v in need or v in leaves or v not in producer or not element[v]:
                continue
            need.add(v)
            stack.extend(producer[v].inputs)
        return [n for n in low.nodes if n.outputs[0] in need]

    # ---- the loops ------------------------------------------------------------------------------
    n_outer = int(np.prod([cdom[k] for k in outer])) if outer else 1
    parallel = n_outer > 1 and int(np.prod(cdom)) >= PARALLEL_MIN_ELEMENTS
    out(decorator(args, parallel))
    out(f"def {name}({', '.join(arg_name[a.value] for a in args)}):")
    rng = "numba.prange" if parallel else "range"
    out(f"    for f in {rng}({n_outer}):")
    ind = "        "
    stride = 1
    for k in reversed(outer):
        if len(outer) == 1:
            out(f"{ind}i{k} = f")
        elif k == outer[0]:
            out(f"{ind}i{k} = f // {stride}")
        else:
            out(f"{ind}i{k} = (f // {stride}) % {cdom[k]}" if stride > 1 else f"{ind}i{k} = f % {cdom[k]}")
        stride *= cdom[k]
    for v in inputs:
        if not element[v]:
            out(f"{ind}{var.setdefault(v, 'x_' + arg_name[v])} = {load(v)}")
    for v in inputs:
        if element[v]:
            var[v] = "e_" + arg_name[v]
    done_lead: set[str] = set()

    def emit_lead(ready_depth: int) -> None:
        for n in low.nodes:
            o = n.outputs[0]
            if n.op in REDUCE_RULES or element[o] or o in done_lead or depth[o] > ready_depth:
                continue
            emit_node(n, ind, per_row=True)
            done_lead.add(o)
            if o in outputs and not looped[o]:
                out(f"{ind}{arg_name[o]}{index(o)} = {var[o]}")

    # Which element values each round computes, and which of them to stash: an expensive value
    # (a transcendental) needed in several rounds is written once into an output buffer that is
    # stored no earlier than the last of those rounds, and read back instead of recomputed (the
    # exp of a softmax: computed for the sum, reused for the scaling).
    plan: list[tuple[list[Node], list[str], list[Node]]] = []
    for r in range(rounds):
        reds = [n for n in low.nodes if n.op in REDUCE_RULES and red_depth[n.name] == r]
        stores = [o for o in outputs if looped[o] and depth[o] == r]
        plan.append((reds, stores, element_closure([n.inputs[0] for n in reds] + stores) if reds or stores else []))
    stash: dict[str, tuple[str, int]] = {}  # value -> (host output, round it is written in)
    hosts: set[str] = set()
    full = tuple(cdom)
    for n in low.nodes:
        v = n.outputs[0]
        if n.op not in EXPENSIVE or not element[v] or v in outputs:
            continue
        used = [r for r, (_, _, nodes) in enumerate(plan) if any(m is n for m in nodes)]
        if len(used) < 2:
            continue
        for o in outputs:
            if (o not in hosts and looped[o] and cshape[o] == full and depth[o] >= used[-1]
                    and low.values[o].dtype == low.values[v].dtype):
                stash[v] = (o, used[0])
                hosts.add(o)
                break

    emit_lead(0)
    for r, (reds, stores, _) in enumerate(plan):
        if not reds and not stores:
            continue
        for n in reds:
            init = literal(REDUCE_RULES[n.op][0], low.values[n.outputs[0]].dtype)
            out(f"{ind}acc_{var[n.outputs[0]]} = {init}")
            if any("{flag}" in u for u in REDUCE_RULES[n.op][1]):
                out(f"{ind}flag_{var[n.outputs[0]]} = False")
        loop_ind = ind
        for k in inner:
            out(f"{loop_ind}for j{k} in range({cdom[k]}):")
            loop_ind += "    "
        targets = [n.inputs[0] for n in reds] + stores
        reuse = {v for v, (_, first) in stash.items() if first < r}
        nodes = element_closure(targets, reuse)
        reads = {i for n in nodes for i in n.inputs} | set(targets)
        for v in inputs:
            if element[v] and v in reads:
                out(f"{loop_ind}{var[v]} = {load(v)}")
        for v in sorted(reuse & reads):
            host = stash[v][0]
            out(f"{loop_ind}{var[v]} = {arg_name[host]}{index(host)}")
        for n in nodes:
            emit_node(n, loop_ind)
            v = n.outputs[0]
            if v in stash and stash[v][1] == r:
                out(f"{loop_ind}{arg_name[stash[v][0]]}{index(stash[v][0])} = {var[v]}")
        for n in reds:
            for upd in REDUCE_RULES[n.op][1]:
                names = {"acc": f"acc_{var[n.outputs[0]]}", "flag": f"flag_{var[n.outputs[0]]}", "v": var[n.inputs[0]]}
                out(f"{loop_ind}{upd.format(**names)}")
        for o in stores:
            out(f"{loop_ind}{arg_name[o]}{index(o)} = {var[o]}")
        for n in reds:
            count = int(np.prod([dom[a] for a in axes]))
            inv = literal(1.0 / count, low.values[n.outputs[0]].dtype)
            fin = REDUCE_RULES[n.op][2].format(
                acc=f"acc_{var[n.outputs[0]]}", flag=f"flag_{var[n.outputs[0]]}", inv_n=inv,
                nan=literal(float("nan"), low.values[n.outputs[0]].dtype),
            )
            fin = round_expr(fin, precision, low.values[n.outputs[0]].dtype)
            out(f"{ind}{var[n.outputs[0]]} = {fenced(fin, low.values[n.outputs[0]].dtype)}")
            done_lead.add(n.outputs[0])
            if n.outputs[0] in outputs and not looped[n.outputs[0]]:
                out(f"{ind}{arg_name[n.outputs[0]]}{index(n.outputs[0])} = {var[n.outputs[0]]}")
        emit_lead(r + 1)
    missing = [o for o in outputs if not looped[o] and o not in done_lead]
    if missing:
        raise NotFusable(f"outputs never stored: {missing}")
    body = "\n".join(lines) + "\n"
    source = kernel_header(body) + body
    nbytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in args)
    flops = int(np.prod(dom)) * len(low.nodes)
    return KernelSource(name, source, tuple(args), "loop", nbytes, flops)


def domain_size(shape: Shape) -> int:
    return int(math.prod(shape))
