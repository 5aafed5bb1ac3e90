"""Program: the compiled kernels of a fused graph, in order, over a preallocated buffer plan.

Building a program generates and compiles one kernel per group and plans every intermediate
buffer once: a value's buffer returns to a free pool after the last kernel that reads it, and a
later value of at most its size takes it (best fit), so the peak memory is what is live at once,
not the sum of all values. Every kernel argument is a view prepared at build time, so one run is
a plain loop of kernel calls with no allocation and no reshaping.

Updates in place: an output named ``updated/<name>``, where ``<name>`` is a graph input (a
training step's weights and optimizer state, :mod:`fusiontune.ir.training`), is written over that
input's buffer when that is safe (:func:`plan_in_place`): the weights, the momentum and Adam's
moments change where they are, as an optimizer does, and the planned peak drops by those outputs.

Reshapes are views: a group that is one Reshape marked ``view`` in its schedule
(ReshapeRemovePass) runs no kernel; its output is its input's buffer under the new shape (every
buffer is C-contiguous), and that buffer lives as long as either is read (:func:`reshape_views`).
A Concat marked ``concat_in_place`` (ConvConcatFusionPass) runs no kernel either: the kernels of
its parts write them into its output's buffer, which the first of them allocates.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numba
import numpy as np

from fusiontune.codegen.cache import compile_kernels
from fusiontune.codegen.common import KernelSource
from fusiontune.codegen.plan import group_sources
from fusiontune.ir.graph import Graph
from fusiontune.ir.ops import get_op
from fusiontune.ir.training import UPDATED_PREFIX
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime.threads import single_threaded_blas

ALIGN = 64


@dataclass(frozen=True)
class KernelInfo:
    """One kernel of a program, for reports: its group, template, cost model and compile record."""

    group: str
    nodes: tuple[str, ...]
    kind: str
    key: str
    bytes_moved: int
    flops: int
    compile_s: float
    cache: str
    instance: str = ""
    """:attr:`KernelSource.instance`: the key plus the shapes and runtime parameters of the call
    (kernels of one source and different sizes share ``key``)."""


@dataclass(frozen=True)
class BufferPlan:
    """Where each value lives: a slot index per value, slot sizes, and the resulting byte counts."""

    slot_of: Mapping[str, int]
    slot_bytes: tuple[int, ...]
    io_bytes: int
    naive_bytes: int
    in_place: Mapping[str, str] = field(default_factory=dict)
    """Outputs written over an input's buffer (``updated/<p>`` -> ``<p>``); not in ``io_bytes``."""
    views: Mapping[str, str] = field(default_factory=dict)
    """Reshape outputs that are views of another value's buffer (output -> that value)."""

    @property
    def peak_bytes(self) -> int:
        """Planned peak: every slot (intermediates reuse them) plus inputs, outputs and constants."""
        return sum(self.slot_bytes) + self.io_bytes


def _round(n: int) -> int:
    return max(ALIGN, -(-n // ALIGN) * ALIGN)


def reshape_views(fused: FusedGraph) -> dict[str, str]:
    """Reshape outputs that need no kernel: value -> the value whose buffer it views.

    A group that is one Reshape node marked ``view`` (ReshapeRemovePass), whose output is no graph
    output, reads a C-contiguous buffer (every buffer is) and writes the same bytes in the same
    order: its output is that buffer viewed with the new shape. Chains resolve to the first buffer.
    """
    g = fused.graph
    outputs = set(g.outputs)
    views: dict[str, str] = {}
    for group in fused.groups:
        if len(group.nodes) != 1 or not group.schedule.get("view"):
            continue
        node = g.node(group.nodes[0])
        if node.op != "Reshape" or node.outputs[0] in outputs:
            continue
        src, out = node.inputs[0], node.outputs[0]
        if g.values[src].dtype != g.values[out].dtype:
            continue
        views[out] = views.get(src, src)
    return views


def concat_in_place(group: Group) -> bool:
    """Whether ``group`` is a Concat whose parts its producers wrote into its output
    (ConvConcatFusionPass): it runs no kernel, and the value is written by those kernels."""
    return bool(group.schedule.get("concat_in_place"))


def _kernel_groups(
    fused: FusedGraph, sources: Sequence[KernelSource], views: Mapping[str, str]
) -> list[tuple[Group, KernelSource]]:
    """The groups that run a kernel (all but the Reshape views and the Concats written in
    place), with their sources."""
    g = fused.graph
    return [
        (grp, src)
        for grp, src in zip(fused.groups, sources, strict=True)
        if not (len(grp.nodes) == 1 and g.node(grp.nodes[0]).outputs[0] in views) and not concat_in_place(grp)
    ]


def plan_in_place(
    fused: FusedGraph, sources: Sequence[KernelSource], views: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The outputs ``updated/<name>`` that may be written over input ``<name>``'s buffer.

    Safe when, with ``k`` the kernel that writes ``updated/<name>``:

    * no kernel after ``k`` reads ``<name>`` (kernels before it read the old value, as they must);
    * ``k`` is a loop nest, or a MatMul kernel that exports its product (the product has its
      own buffer, so only the epilogue writes ``updated/<name>``; otherwise the GEMM may park the
      product in an output buffer before the epilogue reads), and it reads ``<name>`` only
      through elementwise ops that ``updated/<name>`` depends on, with the same view shape as
      ``updated/<name>``: each element is read at the very index it is then written to, and every
      read of it comes before that write;
    * both have one shape and dtype, ``<name>`` is no graph output and ``updated/<name>`` no input.

    A read through a Reshape view is a read of the buffer it views.

    Args:
        fused: the grouped graph.
        sources: the kernels' sources, in group order.
        views: :func:`reshape_views` (their groups run no kernel); computed when not given.

    Returns:
        ``{updated/<name>: <name>}`` for every output updated in place.
    """
    g = fused.graph
    views = reshape_views(fused) if views is None else views
    kernels = _kernel_groups(fused, sources, views)
    inputs, outputs = set(g.inputs), set(g.outputs)
    reads = [{views.get(a.value, a.value) for a in src.args if a.role == "in"} for _, src in kernels]
    found: dict[str, str] = {}
    for k, (group, src) in enumerate(kernels):
        arg_shape = {(a.value, a.role): a.shape for a in src.args}
        for arg in src.args:
            out = arg.value
            name = out[len(UPDATED_PREFIX) :]
            if arg.role != "out" or not out.startswith(UPDATED_PREFIX) or name not in inputs:
                continue
            if name in outputs or out in inputs or not _elementwise_writer(g, group.nodes, src):
                continue
            vo, vi = g.values[out], g.values[name]
            if vo.shape != vi.shape or vo.dtype != vi.dtype:
                continue
            if any(name in r for r in reads[k + 1 :]):
                continue
            if name in reads[k] and arg_shape.get((name, "in")) != arg_shape[(out, "out")]:
                continue
            if not _read_elementwise_before(g, group.nodes, name, out):
                continue
            found[out] = name
    return found


def _elementwise_writer(g: Graph, nodes: Sequence[str], src: KernelSource) -> bool:
    """A loop nest, or a contraction whose product has a buffer of its own (it exports the
    MatMul's output), so its epilogue's outputs are written only by the epilogue."""
    if src.kind == "loop":
        return True
    if src.kind != "contraction":
        return False
    outs = {a.value for a in src.args if a.role == "out"}
    return any(g.node(n).op == "MatMul" and g.node(n).outputs[0] in outs for n in nodes)


def _read_elementwise_before(g: Graph, nodes: Sequence[str], name: str, out: str) -> bool:
    """Inside the group, every reader of ``name`` is elementwise and ``out`` depends on it."""
    readers = [n for n in nodes if name in g.node(n).inputs]
    if any(get_op(g.node(n).op).kind != "elementwise" for n in readers):
        return False
    producer = {o: n for n in nodes for o in g.node(n).outputs}
    ancestors: set[str] = set()
    stack = [producer[out]] if out in producer else []
    while stack:
        n = stack.pop()
        if n in ancestors:
            continue
        ancestors.add(n)
        stack.extend(producer[i] for i in g.node(n).inputs if i in producer)
    return all(n in ancestors for n in readers)


def plan_buffers(fused: FusedGraph, sources: Sequence[KernelSource] | None = None) -> BufferPlan:
    """Assign every intermediate value a slot, reusing slots whose value is dead.

    Inputs, outputs and constants are not planned (they live for the whole run). A kernel's
    outputs are allocated before its inputs are released, so no kernel writes a buffer it reads,
    but for the outputs updated in place (:func:`plan_in_place`), which take their input's buffer
    and count once. An output that nothing reads (a Split piece nobody uses) still gets a slot for
    the kernel to write, free again right after.

    Args:
        fused: the grouped graph.
        sources: the kernels' sources, whose arguments say what each kernel reads and writes;
            generated when not given.
    """
    g = fused.graph
    if sources is None:
        sources = [src for _, src in group_sources(fused)]
    views = reshape_views(fused)
    kernels = [
        (
            grp,
            [views.get(a.value, a.value) for a in src.args if a.role == "in"],
            [a.value for a in src.args if a.role == "out"],
        )
        for grp, src in _kernel_groups(fused, sources, views)
    ]
    pinned = set(g.inputs) | set(g.outputs) | set(g.constants)
    last_use: dict[str, int] = {}
    for k, (_, ins, _) in enumerate(kernels):
        for v in ins:
            last_use[v] = k
    slot_of: dict[str, int] = {}
    slot_bytes: list[int] = []
    free: list[int] = []
    naive = 0
    for k, (_, ins, outs) in enumerate(kernels):
        for v in outs:
            if v in pinned or v in slot_of:  # a Concat's output has a kernel per part
                continue
            need = _round(g.values[v].nbytes)
            naive += need
            fits = [s for s in free if slot_bytes[s] >= need]
            if fits:
                best = min(fits, key=lambda s: slot_bytes[s])
                free.remove(best)
            elif free:
                # Grow the largest free slot rather than open a new one.
                best = max(free, key=lambda s: slot_bytes[s])
                free.remove(best)
                slot_bytes[best] = need
            else:
                best = len(slot_bytes)
                slot_bytes.append(need)
            slot_of[v] = best
        for v in dict.fromkeys(ins):
            if v in slot_of and last_use.get(v) == k:
                free.append(slot_of[v])
        for v in outs:  # produced but never read again (e.g. a side output nobody needs)
            if v in slot_of and v not in last_use:
                free.append(slot_of[v])
    in_place = plan_in_place(fused, sources, views)
    io = sum(_round(g.values[v].nbytes) for v in pinned if v in g.values and v not in in_place)
    derived = {a.value: a for src in sources for d in src.derived for a in src.args if a.value == d.value}
    io += sum(_round(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize) for a in derived.values())
    naive += sum(_round(g.values[v].nbytes) for v in pinned if v in g.values)
    naive += sum(_round(g.values[v].nbytes) for v in views)
    return BufferPlan(slot_of, tuple(slot_bytes), io, naive, in_place, views)


def _entry_point(fn: Callable[..., None], args: Sequence[object]) -> Callable[..., None]:
    """What a program calls for a kernel: the compiled entry point of its dispatcher's one
    signature when ``args`` are exactly of that signature's types, else the dispatcher.

    A program's arguments are its own buffers, fixed when it is built, so their types are checked
    here once. The dispatcher resolves the types of every argument on every call: 270 ns per call
    of a four-array kernel here against 170 for the entry point, which unboxes the same arrays and
    runs the same machine code (on a program of 50 kernels, 5 us a run).
    """
    signatures = getattr(fn, "signatures", None)
    if not signatures or len(signatures) != 1:
        return fn
    (sig,) = signatures
    if tuple(numba.typeof(a) for a in args) != tuple(sig):
        return fn
    return fn.overloads[sig].entry_point  # type: ignore[attr-defined, no-any-return]


class Program:
    """A runnable fused program.

    Attributes:
        graph: the fused graph it runs.
        kernels: per-kernel records, in execution order.
        plan: the buffer plan.
        compile_s: total seconds spent obtaining kernels (compile or cache load).
    """

    def __init__(self, fused: FusedGraph) -> None:
        single_threaded_blas()
        self.fused = fused
        self.graph: Graph = fused.graph
        self.plan, sources = _planned_sources(fused)
        self._slots = [np.empty(n, dtype=np.uint8) for n in self.plan.slot_bytes]
        self._arrays: dict[str, np.ndarray] = {}
        for name in self.graph.inputs:
            v = self.graph.values[name]
            self._arrays[name] = np.empty(v.shape, dtype=v.dtype)
        for name, arr in self.graph.constants.items():
            self._arrays[name] = np.asarray(arr, order="C")  # ascontiguousarray makes a 0-d constant 1-d
        for _, src in sources:
            for d in src.derived:
                if d.value not in self._arrays:
                    self._arrays[d.value] = d.compute(self._arrays[d.source])
        for out, name in self.plan.in_place.items():
            self._arrays[out] = self._arrays[name]
        for name in self.graph.outputs:
            if name not in self._arrays:
                v = self.graph.values[name]
                self._arrays[name] = np.empty(v.shape, dtype=v.dtype)
        for name, slot in self.plan.slot_of.items():
            v = self.graph.values[name]
            self._arrays[name] = self._slots[slot][: v.nbytes].view(v.dtype).reshape(v.shape)
        for name, root in self.plan.views.items():
            self._arrays[name] = self._arrays[root].reshape(self.graph.values[name].shape)
        self._calls: list[tuple[Callable[..., None], tuple[np.ndarray, ...]]] = []
        infos: list[KernelInfo] = []
        t0 = time.perf_counter()
        compiled_all = compile_kernels([src for _, src in sources])
        for (group, src), compiled in zip(sources, compiled_all, strict=True):
            args = src.call_args([self._view(a.value, a.shape) for a in src.args])
            self._calls.append((_entry_point(compiled.fn, args), args))
            infos.append(_info(group, src, compiled.seconds, compiled.source, compiled.key))
        self.compile_s = time.perf_counter() - t0
        self.kernels = tuple(infos)
        self._bound: dict[str, np.ndarray] = {}
        self._updated = frozenset(self.plan.in_place.values())
        self._outputs = {name: self._arrays[name] for name in self.graph.outputs}

    def _view(self, value: str, shape: tuple[int, ...]) -> np.ndarray:
        arr = self._arrays.get(value)
        if arr is None:
            raise KeyError(f"value {value} has no buffer (a group reads a value nobody produced)")
        return arr.reshape(shape)

    @property
    def kernel_count(self) -> int:
        return len(self._calls)

    @property
    def peak_bytes(self) -> int:
        return self.plan.peak_bytes

    @property
    def in_place(self) -> Mapping[str, str]:
        """Outputs written over an input's buffer: ``updated/<name>`` -> ``<name>``."""
        return self.plan.in_place

    def bind(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Copy ``inputs`` into the input buffers.

        The copy is skipped for an array bound last time, except for the inputs updated in place:
        the run changed their buffers, so they are copied again on every bind. The caller's
        arrays are only read, never written.
        """
        for name in self.graph.inputs:
            arr = inputs[name]
            if self._bound.get(name) is arr and name not in self._updated:
                continue
            np.copyto(self._arrays[name], arr, casting="same_kind")
            self._bound[name] = arr

    def execute(self) -> None:
        """Run every kernel once over the bound inputs."""
        for fn, args in self._calls:
            fn(*args)

    def kernel_calls(self) -> tuple[Callable[[], None], ...]:
        """One callable per kernel, in execution order, each running that kernel alone.

        Calling them in order is one :meth:`execute`. A kernel reads what the kernels before it
        wrote, and a later kernel may take over one of its input buffers (the plan reuses dead
        buffers), so a kernel sees its real inputs only right after the kernels before it ran:
        call them in order. A kernel never writes a buffer it reads, so calling one twice in a
        row computes the same thing twice (what a per-kernel timing relies on). The exception is
        a kernel that updates an input in place (:attr:`in_place`, an optimizer step): each call
        reads its own last result (the same work on other values, so its timing holds, but the
        values drift: :meth:`run` again, which re-binds the inputs, to compute the step again).
        """
        return tuple(functools.partial(fn, *args) for fn, args in self._calls)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Bind, execute, and return the outputs (views of the program's buffers: copy to keep).

        An output updated in place is the input's buffer: the next :meth:`run` or :meth:`bind`
        overwrites it with the input again.
        """
        self.bind(inputs)
        self.execute()
        return dict(self._outputs)

    def describe(self) -> list[str]:
        return [f"{k.group}: {k.kind} over {len(k.nodes)} node(s)" for k in self.kernels]


def _info(group: Group, src: KernelSource, seconds: float, cache: str, key: str) -> KernelInfo:
    return KernelInfo(group.name, group.nodes, src.kind, key, src.bytes_moved, src.flops, seconds, cache, src.instance)


def build_program(fused: FusedGraph) -> Program:
    """Generate, compile and plan ``fused`` into a runnable :class:`Program`."""
    return Program(fused)


def _planned_sources(fused: FusedGraph) -> tuple[BufferPlan, list[tuple[Group, KernelSource]]]:
    sources = group_sources(fused)
    plan = plan_buffers(fused, [src for _, src in sources])
    return plan, _kernel_groups(fused, [src for _, src in sources], plan.views)


def precompile(fused: Iterable[FusedGraph], jobs: int | None = None) -> int:
    """Compile into the disk cache every kernel the programs of ``fused`` will need, in parallel.

    What a caller that is about to build many programs (a walk over a test suite's models, a
    bisection's candidates) does first, so that the cold kernels of all of them compile at once
    (:func:`fusiontune.codegen.cache.compile_kernels`) rather than a program's few at a time. A
    graph whose kernels cannot be generated is skipped: its own build reports that.

    Returns:
        How many kernels were compiled.
    """
    srcs: list[KernelSource] = []
    for f in fused:
        try:
            srcs += [src for _, src in _planned_sources(f)[1]]
        except Exception:  # noqa: BLE001 - its build raises it, in its place
            continue
    return sum(1 for k in compile_kernels(srcs, jobs) if k.source == "compiled")
