"""Graph, Value and Node: the immutable IR every stage of the pipeline reads and writes.

A graph is a static-shape dataflow program. Nodes are kept in topological order; every value is
produced by exactly one node, or is a graph input, or a constant (an initializer). Passes never
mutate a graph: they build a new one with :class:`GraphEditor` or the builder DSL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

Shape = tuple[int, ...]

DTYPES = ("float32", "float64", "float16", "int64", "int32", "bool")


@dataclass(frozen=True)
class Value:
    """A tensor in the graph: a name, a static shape and a dtype name."""

    name: str
    shape: Shape
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


def _freeze_attr(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze_attr(x) for x in v)
    if isinstance(v, np.ndarray):
        return tuple(v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    return v


@dataclass(frozen=True)
class Node:
    """One operation: ``outputs = op(inputs, **attrs)``.

    ``origin`` names the nodes of the *original* graph this node stands for. A pass that fuses
    three nodes into one gives the new node the union of their origins; bisection names culprit
    fusions by these names.
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    origin: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        frozen = {k: _freeze_attr(v) for k, v in sorted(dict(self.attrs).items())}
        object.__setattr__(self, "attrs", MappingProxyType(frozen))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "origin", tuple(self.origin) or (self.name,))

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __hash__(self) -> int:
        return hash((self.name, self.op, self.inputs, self.outputs, tuple(self.attrs.items())))


@dataclass(frozen=True, eq=False)
class Graph:
    """A static-shape dataflow graph.

    Attributes:
        name: the workload's name.
        values: every value by name (inputs, constants, node outputs).
        nodes: nodes in topological order.
        inputs: names of graph inputs, in call order.
        outputs: names of graph outputs, in return order.
        constants: initializer arrays by value name.
    """

    name: str
    values: Mapping[str, Value]
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "constants", MappingProxyType(dict(self.constants)))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    # ---- queries -------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        return self.values[name]

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def scalar_constant(self, name: str) -> float | None:
        """The constant's value if ``name`` is a constant with exactly one element."""
        arr = self.constants.get(name)
        if arr is None or arr.size != 1:
            return None
        return float(arr.reshape(()))

    def producers(self) -> dict[str, Node]:
        """Map value name -> the node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """Map value name -> the nodes that read it (in node order, once per node)."""
        users: dict[str, list[Node]] = {name: [] for name in self.values}
        for n in self.nodes:
            for inp in dict.fromkeys(n.inputs):
                users.setdefault(inp, []).append(n)
        return users

    @cached_property
    def _node_index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        return self._node_index[name]

    def node_position(self, name: str) -> int:
        return self._positions[name]

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    # ---- identity ------------------------------------------------------------------------
    def structural_hash(self) -> str:
        """A hash of the computation, independent of value and node names.

        Two graphs with the same ops, attributes, shapes, dtypes, wiring and constant contents
        hash the same. This is the workload key of a search.
        """
        h = hashlib.sha256()
        index: dict[str, int] = {}

        def ref(name: str) -> int:
            if name not in index:
                index[name] = len(index)
            return index[name]

        for name in self.inputs:
            v = self.values[name]
            h.update(f"in {ref(name)} {v.shape} {v.dtype};".encode())
        for name in sorted(self.constants, key=lambda c: self._first_use(c)):
            arr = np.ascontiguousarray(self.constants[name])
            h.update(f"const {ref(name)} {arr.shape} {arr.dtype};".encode())
            h.update(hashlib.sha256(arr.tobytes()).digest())
        from fusiontune.ir.ops import get_op  # local: ops imports graph

        for n in self.nodes:
            ins = ",".join(str(ref(i)) for i in n.inputs)
            outs = ",".join(f"{ref(o)}{self.values[o].shape}{self.values[o].dtype}" for o in n.outputs)
            attrs = sorted({**get_op(n.op).attrs, **n.attrs}.items())
            h.update(f"{n.op}({ins})->{outs} {attrs};".encode())
        h.update(("out " + ",".join(str(ref(o)) for o in self.outputs)).encode())
        return h.hexdigest()[:16]

    def _first_use(self, const: str) -> tuple[int, str]:
        for i, n in enumerate(self.nodes):
            if const in n.inputs:
                return (i, const)
        return (len(self.nodes), const)

    def validate(self) -> None:
        """Raise ``ValueError`` when the graph is not well formed (order, definitions, shapes)."""
        from fusiontune.ir.ops import infer_node  # local: ops imports graph

        defined = set(self.inputs) | set(self.constants)
        for name in defined:
            if name not in self.values:
                raise ValueError(f"{self.name}: value {name!r} has no declaration")
        for n in self.nodes:
            for i in n.inputs:
                if i not in defined:
                    raise ValueError(f"{self.name}: node {n.name} reads {i!r} before it is defined")
            shapes = infer_node(n, [self.values[i] for i in n.inputs])
            for o, (shape, dtype) in zip(n.outputs, shapes, strict=True):
                v = self.values[o]
                if v.shape != shape or v.dtype != dtype:
                    raise ValueError(
                        f"{self.name}: node {n.name} output {o} declared {v.shape}/{v.dtype},"
                        f" inferred {shape}/{dtype}"
                    )
                if o in defined:
                    raise ValueError(f"{self.name}: value {o!r} is defined twice")
                defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise ValueError(f"{self.name}: output {o!r} is never produced")


class GraphEditor:
    """A mutable scratch copy of a graph for passes: replace nodes, then ``finish()``.

    ``finish`` re-sorts nodes topologically, drops values nothing reads, and validates shapes.
    """

    def __init__(self, graph: Graph) -> None:
        self.name = graph.name
        self.values: dict[str, Value] = dict(graph.values)
        self.nodes: list[Node] = list(graph.nodes)
        self.inputs = list(graph.inputs)
        self.outputs = list(graph.outputs)
        self.constants: dict[str, np.ndarray] = dict(graph.constants)
        self._counter = 0

    def fresh(self, stem: str) -> str:
        """A value or node name not yet used in the graph."""
        taken = set(self.values) | {n.name for n in self.nodes}
        while True:
            self._counter += 1
            name = f"{stem}_{self._counter}"
            if name not in taken:
                return name

    def add_constant(self, array: np.ndarray, stem: str = "const") -> str:
        name = self.fresh(stem)
        arr = np.asarray(array)
        self.constants[name] = arr
        self.values[name] = Value(name, tuple(arr.shape), str(arr.dtype))
        return name

    def add_value(self, name: str, shape: Shape, dtype: str) -> str:
        self.values[name] = Value(name, tuple(shape), dtype)
        return name

    def remove_nodes(self, names: Iterable[str]) -> None:
        drop = set(names)
        self.nodes = [n for n in self.nodes if n.name not in drop]

    def add_node(self, node: Node) -> None:
        self.nodes.append(node)

    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of ``old`` (and the graph outputs) read ``new`` instead."""
        self.nodes = [
            Node(n.name, n.op, tuple(new if i == old else i for i in n.inputs), n.outputs, n.attrs, n.origin)
            if old in n.inputs
            else n
            for n in self.nodes
        ]
        self.outputs = [new if o == old else o for o in self.outputs]

    def finish(self) -> Graph:
        nodes = _toposort(self.nodes, set(self.inputs) | set(self.constants))
        # Dead code: keep only nodes that reach an output.
        live = set(self.outputs)
        kept: list[Node] = []
        for n in reversed(nodes):
            if any(o in live for o in n.outputs):
                kept.append(n)
                live.update(n.inputs)
        kept.reverse()
        used = set(self.inputs) | set(self.outputs) | {v for n in kept for v in (*n.inputs, *n.outputs)}
        g = Graph(
            name=self.name,
            values={k: v for k, v in self.values.items() if k in used},
            nodes=tuple(kept),
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            constants={k: v for k, v in self.constants.items() if k in used},
        )
        g.validate()
        return g


def _toposort(nodes: list[Node], available: set[str]) -> list[Node]:
    """Stable topological sort: keeps the given order wherever dependencies allow."""
    producers = {o: n.name for n in nodes for o in n.outputs}
    pending = list(nodes)
    done = set(available)
    ordered: list[Node] = []
    while pending:
        progressed = False
        rest: list[Node] = []
        for n in pending:
            if all(i in done or i not in producers for i in n.inputs):
                ordered.append(n)
                done.update(n.outputs)
                progressed = True
            else:
                rest.append(n)
        if not progressed:
            raise ValueError("graph has a cycle: " + ", ".join(n.name for n in rest[:5]))
        pending = rest
    return ordered
