"""Records shared by the kernel generators: what a kernel takes, its source, why a group is refused."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from fusiontune.codegen.rules import NUMERICS_FUNCTIONS
from fusiontune.ir.expand import EXPANDABLE, expand
from fusiontune.ir.graph import Graph, Node, Shape, Value

# Below this many domain points a kernel runs serially: a parallel launch costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 15


class NotFusable(ValueError):
    """A set of nodes that no kernel template can run as one kernel (the reason says why)."""


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument: which value's buffer, viewed with which shape, read or written."""

    value: str
    shape: Shape
    dtype: str
    role: str  # "in" | "out"


@dataclass(frozen=True)
class Derived:
    """A kernel argument computed once, when the program is built, from a constant of the graph
    (packed conv weights): the runtime calls ``fn(constant, *params)`` and keeps the result for
    the program's life.

    Attributes:
        value: the argument's name (``<constant>#<what>``; the kernel's ArgSpec carries it).
        source: the constant it is computed from.
        fn: ``"module:function"``, a pure function of the constant's array and ``params``.
        params: the function's other arguments (plain ints and strings).
    """

    value: str
    source: str
    fn: str
    params: tuple[int | str, ...] = ()

    def compute(self, array: np.ndarray) -> np.ndarray:
        module, func = self.fn.split(":")
        return np.ascontiguousarray(getattr(importlib.import_module(module), func)(array, *self.params))


@dataclass(frozen=True)
class KernelSource:
    """Generated numba source for one fused group, and what the runtime must pass it.

    Attributes:
        name: the Python function name in ``source``.
        source: a complete module; the function is decorated with ``numba.njit``.
        args: arguments in call order; the runtime passes each buffer reshaped to ``shape``.
        kind: loop | contraction | layout.
        bytes_moved: the least bytes the kernel must read and write (the roofline numerator).
        flops: floating point operations, approximately (scalar ops x domain points).
        derived: arguments the runtime computes once from constants (:class:`Derived`).
        params: integers the kernel reads at run time from one more, last argument (an int64
            array), instead of constants in its source: a kernel that takes its sizes this way
            serves every shape of its structure with one compile (conv.py's packed kernel).
    """

    name: str
    source: str
    args: tuple[ArgSpec, ...]
    kind: str
    bytes_moved: int
    flops: int
    derived: tuple[Derived, ...] = ()
    params: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """The kernel cache key: a hash of everything the compiled machine code depends on.

        That is the source, the argument types (dtype and rank: numba's signature; a size the code
        depends on is a constant in the source or one of ``params``), numba's version, and the
        text of every fusiontune module the source imports (directly or through another one):
        numba's disk cache of a kernel checks only the kernel's own file, so machine code inlined
        from an edited helper (codegen/blas.py, codegen/numerics.py) would otherwise outlive the
        edit. ``params`` are not in it: they are data. Two groups of one structure and different
        sizes share a key, and :attr:`instance` tells them apart.
        """
        h = hashlib.sha256(self.source.encode())
        for a in self.args:
            h.update(f"{len(a.shape)}{a.dtype}{a.role}".encode())
        # a derived argument by what computes it and where it is passed: not by the names of the
        # values (exporters name one weight differently), nor by its params (a layout the code
        # depends on is in the source or in ``params``, like any other size)
        values = [a.value for a in self.args]
        for d in self.derived:
            h.update(f"{values.index(d.value)} {d.fn}".encode())
        h.update(f"numba {numba.__version__}".encode())
        for name in helper_modules(self.source):
            h.update(f"{name} {_module_digest(name)}".encode())
        return h.hexdigest()[:20]

    @property
    def instance(self) -> str:
        """The key plus what a call passes: the argument shapes, the derived arguments' inputs
        and the runtime ``params`` (a program's identity is its kernels' instances, in order)."""
        h = hashlib.sha256(self.key.encode())
        h.update(repr([a.shape for a in self.args]).encode())
        h.update(repr([(d.source, d.params) for d in self.derived]).encode())
        h.update(repr(self.params).encode())
        return h.hexdigest()[:20]

    def call_args(self, buffers: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        """The arguments of a call: ``buffers`` (one per :attr:`args`), then the ``params`` array
        when the kernel takes one."""
        if not self.params:
            return tuple(buffers)
        return (*buffers, np.array(self.params, dtype=np.int64))


_FUSIONTUNE_IMPORT = re.compile(r"^[ \t]*(?:from|import)[ \t]+(fusiontune(?:\.\w+)*)", re.MULTILINE)


def helper_modules(source: str) -> tuple[str, ...]:
    """The fusiontune modules that ``source`` imports, directly or through one another, sorted.

    Args:
        source: Python source text, e.g. a generated kernel module.

    Returns:
        Dotted module names, e.g. ``("fusiontune.codegen.blas",)``.
    """
    seen: set[str] = set()
    todo = _FUSIONTUNE_IMPORT.findall(source)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_FUSIONTUNE_IMPORT.findall(_module_text(name)))
    return tuple(sorted(seen))


@functools.cache
def _module_text(name: str) -> str:
    # Read once per process: the version loaded here is the one a kernel compiled here links.
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return ""
    return Path(spec.origin).read_text(encoding="utf-8")


@functools.cache
def _module_digest(name: str) -> str:
    return hashlib.sha256(_module_text(name).encode()).hexdigest()


def numba_type(dtype: str, rank: int) -> str:
    """The numba signature type of a C-contiguous array, e.g. ``float32[:, ::1]``."""
    base = {"bool": "boolean"}.get(dtype, dtype)
    dims = ", ".join([":"] * (rank - 1) + ["::1"])
    return f"{base}[{dims}]"


def signature(args: Sequence[ArgSpec], params: bool = False) -> str:
    types = [numba_type(a.dtype, len(a.shape)) for a in args] + (["int64[::1]"] if params else [])
    return "void(" + ", ".join(types) + ")"


def decorator(args: Sequence[ArgSpec], parallel: bool, reassoc: bool = True, params: bool = False,
              contract: bool = False) -> str:
    """The ``@numba.njit`` line: eager signature, disk cache, numpy error model.

    ``params``: the kernel takes :attr:`KernelSource.params` as a last ``int64[::1]`` argument.

    ``reassoc`` lets LLVM vectorize float reductions: it reorders sums and products, which
    changes rounding and, for operands near the float limits, can overflow where the written
    order would not; it includes ``contract``. ``contract`` alone fuses a product and the sum it
    feeds into one multiply-add (one rounding instead of two), in the written order. No other
    fast-math flag is set: NaN and inf inputs keep their meaning.

    In a process whose numba may run one thread only (``NUMBA_NUM_THREADS=1``: a Ray worker given
    one CPU by its launcher, a user pinned to one core) no kernel is compiled parallel: its
    ``prange`` loops run as ``range``. A parallel region still enters the threading layer with one
    thread: 1.08 us a call on TBB against 0.15 for the same loop compiled serial.
    """
    parallel = parallel and numba.config.NUMBA_NUM_THREADS > 1
    fm = "{'reassoc', 'contract'}" if reassoc else "{'contract'}" if contract else "False"
    return (
        f"@numba.njit('{signature(args, params)}', parallel={parallel}, cache=True, nogil=True,"
        f" error_model='numpy', fastmath={fm})"
    )


def task_threads(parallel: bool) -> int:
    """The threads a kernel's tasks are dealt to: numba's (a literal in the source, so the kernel
    stays cacheable) when it runs in parallel, else one, so that a serial kernel is not cut into
    blocks for threads it does not use."""
    return int(numba.config.NUMBA_NUM_THREADS) if parallel else 1


HEADER = "import math\nimport numpy as np\nimport numba\n\n\n"


def kernel_header(body: str, imports: Sequence[str] = ()) -> str:
    """The module header of a kernel whose code is ``body``: :data:`HEADER`, ``imports``, and the
    functions of codegen/numerics.py that ``body`` calls.

    A kernel calling numerics carries ``NUMERICS_VERSION`` (a hash of numerics.py) in a comment:
    numba's disk cache of the kernel would keep the machine code of an old version of the
    functions it inlined, while a new comment makes a new source, hence a new kernel key. The
    import of numerics (which loads its compiled functions) happens only for such kernels.
    """
    lines = ["import math", "import numpy as np", "import numba", *imports]
    used = [f for f in NUMERICS_FUNCTIONS if re.search(rf"\b{f}\(", body)]
    if used:
        from fusiontune.codegen.numerics import NUMERICS_VERSION

        lines.append(f"from fusiontune.codegen.numerics import {', '.join(used)}")
        lines.append(f"# fusiontune.codegen.numerics version {NUMERICS_VERSION}")
    return "\n".join(lines) + "\n\n\n"


@dataclass
class Lowered:
    """A group's nodes with fused normalizations expanded into primitives."""

    nodes: list[Node]
    values: dict[str, Value]
    scalars: dict[str, float]  # scalar constants, inlined as literals
    arrays: dict[str, np.ndarray]  # non-scalar constants, passed as arguments


def lower_group(graph: Graph, node_names: Sequence[str], keep: Sequence[str] = ()) -> Lowered:
    """Collect a group's nodes, expanding fused ops, and sort constants into scalars and arrays.

    Common subexpressions are merged (an expansion recomputes ``x - max`` and ``exp`` for its
    elementwise part so that it can be split; inside one kernel they are computed once). Values
    in ``keep`` (the group's outputs) are never merged away.
    """
    values: dict[str, Value] = dict(graph.values)
    nodes: list[Node] = []
    extra_consts: dict[str, np.ndarray] = {}
    for name in node_names:
        node = graph.node(name)
        if node.op in EXPANDABLE:
            e = expand(node, values)
            values.update(e.values)
            extra_consts.update(e.constants)
            nodes.extend(e.nodes)
        else:
            nodes.append(node)
    nodes = _cse(nodes, set(keep))
    for n in nodes:
        for v in (*n.inputs, *n.outputs):
            if values[v].dtype == "float16":
                # Low-precision intermediates are emulated by a pass of their own; numba has no
                # float16 arithmetic, so a float16 tensor is refused here, not crashed on later.
                raise NotFusable(f"{v}: float16 tensors have no numba kernel")
    scalars: dict[str, float] = {}
    arrays: dict[str, np.ndarray] = {}
    read = {i for n in nodes for i in n.inputs}
    for name in read:
        arr = extra_consts.get(name, graph.constants.get(name))
        if arr is None:
            continue
        if arr.size == 1 and arr.dtype.kind in "fib":
            # An integer stays a Python int: a float would round INT64_MAX (a mask fill) to 2**63.
            scalars[name] = arr.reshape(()).item() if arr.dtype.kind in "iu" else float(arr.reshape(()))
        else:
            arrays[name] = arr
    return Lowered(nodes, values, scalars, arrays)


def _cse(nodes: list[Node], keep: set[str]) -> list[Node]:
    seen: dict[tuple[object, ...], str] = {}
    rename: dict[str, str] = {}
    out: list[Node] = []
    for n in nodes:
        ins = tuple(rename.get(i, i) for i in n.inputs)
        if ins != n.inputs:
            n = Node(n.name, n.op, ins, n.outputs, n.attrs, n.origin)
        key = (n.op, ins, tuple(sorted(n.attrs.items())))
        if len(n.outputs) == 1 and key in seen and n.outputs[0] not in keep:
            rename[n.outputs[0]] = seen[key]
            continue
        if len(n.outputs) == 1:
            seen.setdefault(key, n.outputs[0])
        out.append(n)
    return out


def align(shape: Shape, rank: int) -> Shape:
    """Right-align ``shape`` to ``rank`` dims with leading 1s (numpy broadcasting)."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def as_dict(m: Mapping[str, object]) -> dict[str, object]:
    return dict(m)
