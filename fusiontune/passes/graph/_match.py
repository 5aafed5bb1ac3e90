"""Shared matching helpers for the GraphFusion passes.

A pass describes each match as a :class:`Fusion` (the nodes it replaces and the node that
replaces them, with, when it needs them, a few new nodes around it: :class:`Step`), built by the
rules it hands to :func:`fusiontune.passes.pattern.apply_rules`, which checks the preconditions
every fusion shares (:meth:`View.valid`, :func:`closes_cycle`), asks ``ctx.allow`` and applies
the allowed ones.

Matches are found on one snapshot of the graph and applied to one editor. That is sound because a
fusion keeps the names of the values it exposes (the new node writes the old root's outputs) and
removes only values nothing outside the match reads, so fusions that do not share nodes do not
interfere (:func:`closes_cycle` guards the one exception, fusions that expose an inner value), and
application indices follow node order, stable for a given graph and config.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusiontune.ir.graph import Graph, GraphEditor, Node, Shape, Value
from fusiontune.ir.ops import get_op, infer_node, normalize_axes

SCALAR_TOL = 1e-6

Operand = str | np.ndarray


def op_attrs(op: str, **attrs: Any) -> dict[str, Any]:
    """``attrs`` without the entries equal to the op's defaults (the builder's canonical form)."""
    defaults = get_op(op).attrs
    return {k: v for k, v in attrs.items() if not (k in defaults and defaults[k] == v)}


def effective_attrs(node: Node) -> dict[str, Any]:
    """The node's attributes with the op's defaults filled in."""
    return {**get_op(node.op).attrs, **node.attrs}


@dataclass(frozen=True)
class Ref:
    """The output of an earlier :class:`Step` of the same fusion (its index in ``steps``)."""

    step: int


StepInput = str | np.ndarray | Ref


@dataclass(frozen=True, eq=False)
class Step:
    """One new node of a fusion: ``op`` over inputs that are value names, arrays (new constants)
    or :class:`Ref` to an earlier step's output.

    Attributes:
        op: the op.
        inputs: its inputs.
        attrs: its attributes (defaults left out).
        origin: the original node names it stands for; None: the fusion's.
    """

    op: str
    inputs: tuple[StepInput, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    origin: tuple[str, ...] | None = None


@dataclass(frozen=True, eq=False)
class Fusion:
    """A candidate rewrite: ``nodes`` become one ``op`` node that writes ``outputs``.

    Most fusions are that one node. One that needs a few more (a Transpose of an operand, a
    Reshape of the result) lists them in ``before`` and ``after``: the steps run in the order
    ``(*before, the op node, *after)``, a :class:`Ref` names a step by its index in that order,
    every step but the last writes one new value, and the last writes ``outputs``.

    Attributes:
        pattern: the pattern name for the fusion log.
        nodes: the matched nodes.
        op: the replacing op.
        inputs: its inputs: value names, arrays that become new constants, or :class:`Ref`.
        outputs: the value names the last step writes, each produced by one of ``nodes`` (names
            are kept so that readers outside the match and graph outputs need no rewiring).
        attrs: its attributes (defaults left out).
        before: new nodes computed before the op node (its operands).
        after: new nodes computed from the op node's output (the last of them writes ``outputs``).
    """

    pattern: str
    nodes: tuple[Node, ...]
    op: str
    inputs: tuple[StepInput, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    before: tuple[Step, ...] = ()
    after: tuple[Step, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(n.name for n in self.nodes)

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every new node, in order: ``before``, the op node, ``after``."""
        return (*self.before, Step(self.op, self.inputs, self.attrs), *self.after)

    def reads(self) -> set[str]:
        """The existing values the new nodes read."""
        return {i for s in self.steps for i in s.inputs if isinstance(i, str)}

    def apply(self, editor: GraphEditor, origin: tuple[str, ...]) -> None:
        steps = self.steps
        names = [editor.fresh(s.op) for s in steps]
        written: list[str] = []
        editor.remove_nodes(self.names)
        for k, (step, name) in enumerate(zip(steps, names, strict=True)):
            ins = tuple(
                i
                if isinstance(i, str)
                else written[i.step]
                if isinstance(i, Ref)
                else editor.add_constant(i, f"{step.op}_param")
                for i in step.inputs
            )
            if k == len(steps) - 1:
                outs = self.outputs
            else:
                probe = Node(name, step.op, ins, (name,), dict(step.attrs))
                ((shape, dtype),) = infer_node(probe, [editor.values[i] for i in ins])
                outs = (editor.add_value(name, shape, dtype),)
                written.append(name)
            node_origin = origin if step.origin is None else step.origin
            editor.add_node(Node(name, step.op, ins, outs, dict(step.attrs), node_origin))


class View:
    """Read-only queries over one graph snapshot: producers, readers, scalar constants."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._producer = graph.producers()
        self._readers = graph.consumers()
        self._outputs = frozenset(graph.outputs)

    # ---- values --------------------------------------------------------------------------
    def shape(self, value: str) -> Shape:
        return self.graph.values[value].shape

    def dtype(self, value: str) -> str:
        return self.graph.values[value].dtype

    def is_output(self, value: str) -> bool:
        return value in self._outputs

    def is_param(self, value: str, n: int) -> bool:
        """A constant or graph input of shape ``(n,)`` (a norm's gamma or beta)."""
        g = self.graph
        return self.shape(value) == (n,) and (g.is_constant(value) or value in g.inputs)

    def scalar_is(self, value: str, target: float, tol: float = SCALAR_TOL) -> bool:
        """True when ``value`` is a one-element constant within ``tol`` (relative above 1) of target."""
        v = self.graph.scalar_constant(value)
        return v is not None and abs(v - target) <= tol * max(1.0, abs(target))

    def scalar_attr(self, value: str) -> float:
        """A one-element constant as the shortest decimal that round-trips in its own dtype.

        A float32 eps of 1e-5 becomes the attribute 1e-05, not 9.99999974738e-06, so a fused
        norm prints and hashes like one written by hand and computes the same in float32.
        """
        scalar = self.graph.constants[value].reshape(-1)[0]
        if np.issubdtype(scalar.dtype, np.floating):
            return float(np.format_float_positional(scalar, unique=True, trim="-"))
        return float(scalar)

    # ---- wiring --------------------------------------------------------------------------
    def producer(self, value: str, *ops: str) -> Node | None:
        """The node writing ``value``, when there is one and (if given) its op is among ``ops``."""
        node = self._producer.get(value)
        if node is None or (ops and node.op not in ops):
            return None
        return node

    def readers(self, value: str) -> list[Node]:
        return self._readers.get(value, [])

    def sole_reader(self, value: str, *ops: str) -> Node | None:
        """The one node reading ``value`` (no graph output), when its op is among ``ops``."""
        users = self.readers(value)
        if len(users) != 1 or value in self._outputs or (ops and users[0].op not in ops):
            return None
        return users[0]

    @staticmethod
    def orders(node: Node) -> Iterator[tuple[str, str]]:
        """Both operand orders of a binary commutative node (once when they are equal)."""
        if len(node.inputs) != 2:
            return
        a, b = node.inputs
        yield a, b
        if a != b:
            yield b, a

    def reduce_axis(self, node: Node) -> int | None:
        """The single (normalized) axis of a keepdims reduction, or None."""
        attrs = effective_attrs(node)
        rank = len(self.shape(node.inputs[0]))
        if not attrs.get("keepdims", True) or rank == 0:
            return None
        axes = normalize_axes(attrs.get("axes"), rank)
        return axes[0] if len(axes) == 1 else None

    def origin(self, nodes: Iterable[Node]) -> tuple[str, ...]:
        """The union of the nodes' origins, in node order."""
        ordered = sorted(nodes, key=lambda n: self.graph.node_position(n.name))
        return tuple(dict.fromkeys(o for n in ordered for o in n.origin))

    # ---- the preconditions every fusion shares -------------------------------------------
    def valid(self, f: Fusion) -> bool:
        """Values the fusion removes are read only inside it; the new node types as the old ones.

        The new node must not read a value the matched nodes produce (a dangling read or a
        self-loop), and its inferred outputs must have the declared shapes and dtypes.
        """
        names = f.names
        produced = {o for n in f.nodes for o in n.outputs}
        if not set(f.outputs) <= produced:
            return False
        for v in produced - set(f.outputs):
            if v in self._outputs or any(r.name not in names for r in self.readers(v)):
                return False
        if f.reads() & produced:
            return False
        steps = f.steps
        written: list[Value] = []
        for k, step in enumerate(steps):
            ins: list[Value] = []
            for j, i in enumerate(step.inputs):
                if isinstance(i, Ref):
                    if i.step >= k:
                        return False
                    ins.append(written[i.step])
                elif isinstance(i, str):
                    ins.append(self.graph.values[i])
                else:
                    ins.append(Value(f"p{k}_{j}", tuple(i.shape), str(i.dtype)))
            last = k == len(steps) - 1
            outs = f.outputs if last else (f"s{k}",)
            probe = Node(f"probe{k}", step.op, tuple(v.name for v in ins), outs, dict(step.attrs))
            try:
                inferred = infer_node(probe, ins)
            except ValueError:
                return False
            if not last:
                if len(inferred) != 1:
                    return False
                written.append(Value(f"s{k}", *inferred[0]))
                continue
            return all(
                (self.shape(o), self.dtype(o)) == (shape, dtype)
                for o, (shape, dtype) in zip(f.outputs, inferred, strict=True)
            )
        return False  # pragma: no cover - a fusion has at least its op step


def closes_cycle(editor: GraphEditor, f: Fusion) -> bool:
    """True when an input of ``f`` is computed, outside ``f``, from a value ``f`` produces.

    A fusion whose outputs all come from its one sink cannot do that: the path would be a cycle
    of the graph already, and contracting such fusions never joins two paths. A fusion that also
    exposes an inner value (AddLayerNorm's sum) can, alone or with earlier fusions of the same
    kind, so for it the current editor state, earlier fusions included, is walked.
    """
    if len({n.name for n in f.nodes if set(n.outputs) & set(f.outputs)}) <= 1:
        return False
    names = f.names
    produced = {o for n in f.nodes for o in n.outputs}
    producer = {o: n for n in editor.nodes if n.name not in names for o in n.outputs}
    stack = sorted(f.reads())
    seen: set[str] = set()
    while stack:
        v = stack.pop()
        if v in produced:
            return True
        node = producer.get(v)
        if node is not None and v not in seen:
            seen.add(v)
            stack.extend(node.inputs)
    return False


class Forwarder:
    """Collects "readers of ``old`` now read ``new``" rewrites that keep graph output names.

    When ``old`` is a graph output, the value it forwards to is renamed to ``old`` instead, so the
    graph's outputs keep their names; that needs a value a surviving node writes, which is not
    itself a graph output (:meth:`can_forward` says whether it holds).
    """

    def __init__(self, view: View) -> None:
        self.view = view
        self.alias: dict[str, str] = {}
        self.renamed: dict[str, str] = {}

    def resolve(self, value: str) -> str:
        while value in self.alias:
            value = self.alias[value]
        return value

    def can_forward(self, old: str, new: str) -> bool:
        if not self.view.is_output(old):
            return True
        target = self.resolve(new)
        return (
            self.view.producer(target) is not None
            and not self.view.is_output(target)
            and target not in self.renamed
        )

    def forward(self, old: str, new: str) -> None:
        target = self.resolve(new)
        if self.view.is_output(old):
            self.renamed[target] = old
        self.alias[old] = target

    def apply(self, editor: GraphEditor) -> None:
        """Rewire every node and graph output of ``editor`` through the collected rewrites."""

        def name(v: str) -> str:
            t = self.resolve(v)
            return self.renamed.get(t, t)

        editor.nodes = [
            Node(
                n.name,
                n.op,
                tuple(map(name, n.inputs)),
                tuple(map(name, n.outputs)),
                n.attrs,
                n.origin,
            )
            for n in editor.nodes
        ]
        editor.outputs = [name(o) for o in editor.outputs]
