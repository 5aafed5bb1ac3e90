"""Reverse-mode autodiff over the IR: one vector-Jacobian rule per op, written as IR ops.

``grad_graph(graph, wrt, loss=...)`` returns a new graph that runs the forward graph and then its
backward: the gradients of a scalar loss (or, with ``loss=None``, of every float output against a
cotangent input of the output's shape) with respect to named inputs, weights (constants) or
intermediate values. The backward is an ordinary graph: the interpreter runs it, the passes fuse it,
codegen compiles it. Its nodes read the forward values they need (saved activations) directly.

A rule is registered in :data:`VJP_RULES` by op name (``@vjp("Mul")``) and lives in one of the
``_vjp_*`` modules, one per family of ops. It receives a :class:`VjpContext` (the node, builder
handles on its inputs and outputs, the cotangents of its outputs) and returns one gradient per
input, or ``None`` for an input that needs none. An op that carries no gradient is declared in
:data:`NON_DIFFERENTIABLE` with the reason; every op of the catalogue is in exactly one of the two
tables (``tests/ir/test_autodiff.py`` fails otherwise), so a new op cannot be added without deciding.

Where an op is not differentiable the rules take one subgradient, as torch and JAX do: Relu and
Abs have slope 0 at 0; LeakyRelu, PRelu, Elu and Selu the slope of the branch their reference takes
at 0; Clip passes the gradient on its closed interval, HardSigmoid (and HardSwish's gate) on its
open one; ties of ReduceMax, MaxPool, Maximum, Minimum and ScatterND's max / min share the gradient
evenly (so a maximum taken over copies of one value still gets its whole gradient); Mod is
``a - q * b`` with the quotient ``q`` held constant; of repeated ScatterND indices with
``reduction="none"`` only the update that was written last gets a gradient. One known gap: with
``reduction="mul"`` an update's gradient is ``g * y / update``, undefined where an update is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph, GraphEditor, Node, Shape, Value
from fusiontune.ir.ops import FLOAT_DTYPES, get_op

VjpRule = Callable[["VjpContext"], Sequence["Tensor | None"]]

VJP_RULES: dict[str, VjpRule] = {}
"""Op name -> its vector-Jacobian rule."""

NON_DIFFERENTIABLE: dict[str, str] = {
    "Greater": "comparison: a bool output",
    "Less": "comparison: a bool output",
    "Equal": "comparison: a bool output",
    "GreaterOrEqual": "comparison: a bool output",
    "LessOrEqual": "comparison: a bool output",
    "And": "logic: bool in, bool out",
    "Or": "logic: bool in, bool out",
    "Xor": "logic: bool in, bool out",
    "Not": "logic: bool in, bool out",
    "IsNaN": "predicate: a bool output",
    "IsInf": "predicate: a bool output",
    "Sign": "piecewise constant: its derivative is zero wherever it exists",
}
"""Op name -> why it carries no gradient. Gradients stop at these ops (their outputs are constant
to the backward pass); an index input of a differentiable op (Gather's indices) is never
differentiated either, being an integer tensor."""

MISSING_RULES: dict[str, str] = {}
"""Ops that should carry a gradient but have no rule yet, with what is missing (empty: none)."""

GRADIENT_PREFIX = "grad/"
COTANGENT_PREFIX = "cotangent/"


def gradient_name(value: str, prefix: str = GRADIENT_PREFIX) -> str:
    """The name of the output of :func:`grad_graph` that holds the gradient of ``value``."""
    return prefix + value


def cotangent_name(output: str) -> str:
    """The name of the input of :func:`grad_graph` (``loss=None``) that seeds ``output``."""
    return COTANGENT_PREFIX + output


def vjp(*ops: str) -> Callable[[VjpRule], VjpRule]:
    """Register the decorated function as the vector-Jacobian rule of ``ops``."""

    def register(rule: VjpRule) -> VjpRule:
        for op in ops:
            if op in VJP_RULES:
                raise ValueError(f"{op} already has a VJP rule")
            VJP_RULES[op] = rule
        return rule

    return register


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


@dataclass
class VjpContext:
    """What a rule sees of one forward node.

    Attributes:
        b: the builder the backward graph is written with (``b.mul(...)``, ``b.op("Slice", ...)``).
        node: the forward node.
        attrs: the node's attributes over the op's defaults.
        inputs: builder handles on the node's inputs (forward values).
        outputs: builder handles on the node's outputs (forward values).
        cotangents: per output, the cotangent flowing back into it, or None when nothing downstream
            depends on it (use :meth:`cot`, which makes the zeros).
        needs: per input, whether its gradient is wanted.
    """

    b: GraphBuilder
    node: Node
    attrs: Mapping[str, Any]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    cotangents: tuple[Tensor | None, ...]
    needs: tuple[bool, ...]

    def x(self, i: int = 0) -> Tensor:
        return self.inputs[i]

    def y(self, i: int = 0) -> Tensor:
        return self.outputs[i]

    def cot(self, i: int = 0) -> Tensor:
        """The cotangent of output ``i`` (zeros of its shape when none flows back)."""
        g = self.cotangents[i]
        return g if g is not None else zeros(self.b, self.outputs[i].shape, self.outputs[i].dtype)

    @property
    def g(self) -> Tensor:
        """The cotangent of the only (first) output."""
        return self.cot(0)


# ---- helpers the rules share ---------------------------------------------------------------------
def scalar(b: GraphBuilder, value: float, dtype: str) -> Tensor:
    """A rank-0 constant of ``dtype``."""
    return b.const(np.asarray(value, dtype=dtype), dtype=dtype)


def zeros(b: GraphBuilder, shape: Shape, dtype: str) -> Tensor:
    """Zeros of ``shape``: a scalar constant expanded (no large constant in the graph)."""
    return b.expand(scalar(b, 0.0, dtype), shape)


def reshape(b: GraphBuilder, x: Tensor, shape: Shape) -> Tensor:
    return x if tuple(x.shape) == tuple(shape) else b.reshape(x, shape)


def sum_to(b: GraphBuilder, g: Tensor, shape: Shape) -> Tensor:
    """Sum ``g`` down to ``shape``, the shape of an operand broadcast into ``g`` (numpy rules)."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = len(g.shape) - len(shape)
    axes = list(range(lead))
    axes += [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    if axes:
        g = b.reduce_sum(g, axes, keepdims=True)
    return reshape(b, g, shape)


def where0(b: GraphBuilder, cond: Tensor, g: Tensor) -> Tensor:
    """``g`` where ``cond`` holds, zero elsewhere."""
    return b.where(cond, g, scalar(b, 0.0, g.dtype))


def mask(b: GraphBuilder, cond: Tensor, dtype: str) -> Tensor:
    """``cond`` as 0.0 / 1.0 of ``dtype``."""
    return b.cast(cond, dtype)


def swap_last(b: GraphBuilder, x: Tensor) -> Tensor:
    """``x`` with its last two axes swapped."""
    r = len(x.shape)
    return b.transpose(x, (*range(r - 2), r - 1, r - 2))


# ---- the backward builder --------------------------------------------------------------------------
def extend(graph: Graph, dtype: str = "float32") -> GraphBuilder:
    """A builder that holds ``graph`` and adds nodes after it, never reusing one of its node names.

    ``builder.graph(name)`` returns what was built, unvalidated; finish it with
    :class:`GraphEditor` (which drops what no output needs).
    """
    return _BackwardBuilder(graph, dtype)


class _BackwardBuilder(GraphBuilder):
    """A builder that starts from a forward graph and never reuses one of its node names."""

    def __init__(self, graph: Graph, dtype: str) -> None:
        super().__init__(graph.name, dtype)
        self.values.update(graph.values)
        self.nodes.extend(graph.nodes)
        self.inputs.extend(graph.inputs)
        self.constants.update(graph.constants)
        self._taken = {n.name for n in graph.nodes}

    def _fresh(self, stem: str) -> str:
        while True:
            name = super()._fresh(stem)
            if name not in self._taken:
                self._taken.add(name)
                return name

    def tensor(self, name: str) -> Tensor:
        return Tensor(self, name)

    def rename(self, old: str, new: str) -> None:
        """Give the value ``old`` (made by a backward node) the name ``new``, everywhere."""
        if new in self.values:
            raise ValueError(f"value {new!r} already exists")
        v = self.values.pop(old)
        self.values[new] = Value(new, v.shape, v.dtype)
        self.nodes = [
            Node(
                n.name,
                n.op,
                tuple(new if i == old else i for i in n.inputs),
                tuple(new if o == old else o for o in n.outputs),
                n.attrs,
                n.origin,
            )
            if old in n.inputs or old in n.outputs
            else n
            for n in self.nodes
        ]

    def graph(self, name: str) -> Graph:
        """The graph built so far (validated by :meth:`GraphEditor.finish` later)."""
        return Graph(
            name,
            self.values,
            tuple(self.nodes),
            tuple(self.inputs),
            tuple(self.outputs),
            self.constants,
        )


def _float_dtype(graph: Graph, names: Sequence[str]) -> str:
    for name in names:
        if is_float(graph.values[name].dtype):
            return graph.values[name].dtype
    return "float32"


def _active_values(graph: Graph, wrt: Sequence[str]) -> set[str]:
    """Float values that depend on ``wrt`` through differentiable ops."""
    active = set(wrt)
    for n in graph.nodes:
        if n.op in NON_DIFFERENTIABLE or not any(i in active for i in n.inputs):
            continue
        active.update(o for o in n.outputs if is_float(graph.values[o].dtype))
    return active


def grad_graph(
    graph: Graph,
    wrt: Sequence[str],
    loss: str | None = None,
    keep_outputs: bool = True,
    prefix: str = GRADIENT_PREFIX,
) -> Graph:
    """The forward graph followed by its backward: the gradients of ``loss`` w.r.t. ``wrt``.

    Args:
        graph: the forward graph.
        wrt: float values to differentiate with respect to: graph inputs, constants (weights) or
            intermediate values.
        loss: a float output with one element, seeded with 1. ``None`` differentiates every float
            output that depends on ``wrt`` against a cotangent: a new graph input named
            ``cotangent_name(output)`` of the output's shape (the vector of a vector-Jacobian
            product; the gradient is then that of ``sum(cotangent * output)`` over the outputs).
        keep_outputs: keep the forward outputs first among the outputs.
        prefix: what the gradients' names start with (another one differentiates a graph that
            already holds gradients, for second derivatives).

    Returns:
        A graph with the forward inputs (then the cotangent inputs), whose outputs are the forward
        outputs (when kept) followed by one gradient per ``wrt`` value, named
        ``gradient_name(value, prefix)``, of that value's shape and dtype. A value the loss does not depend
        on gets zeros.

    Raises:
        ValueError: an unknown or non-float ``wrt`` value, a gradient name the graph already
            uses, or a ``loss`` that is not a one-element float output.
        NotImplementedError: an op on the path from ``wrt`` to the loss has no VJP rule.
    """
    for name in wrt:
        if name not in graph.values:
            raise ValueError(f"{graph.name}: no value {name!r} to differentiate with respect to")
        if not is_float(graph.values[name].dtype):
            raise ValueError(
                f"{graph.name}: {name!r} is {graph.values[name].dtype}, not a float tensor"
            )
        if gradient_name(name, prefix) in graph.values:
            raise ValueError(
                f"{graph.name}: the graph already has a value {gradient_name(name, prefix)!r};"
                " pass another prefix"
            )
    if len(set(wrt)) != len(wrt):
        raise ValueError(f"{graph.name}: wrt names a value twice: {list(wrt)}")
    active = _active_values(graph, wrt)
    b = _BackwardBuilder(graph, _float_dtype(graph, [*(loss and [loss] or []), *wrt]))
    cots: dict[str, list[Tensor]] = {}
    if loss is not None:
        if loss not in graph.outputs:
            raise ValueError(f"{graph.name}: loss {loss!r} is not an output of the graph")
        v = graph.values[loss]
        if v.size != 1 or not is_float(v.dtype):
            raise ValueError(
                f"{graph.name}: loss {loss!r} must be a one-element float tensor, got {v.shape} {v.dtype}"
                " (loss=None differentiates against cotangent inputs)"
            )
        if loss in active:
            cots[loss] = [
                b.const(np.ones(v.shape, dtype=v.dtype), name=b._fresh("grad/seed"), dtype=v.dtype)
            ]
    else:
        for o in dict.fromkeys(graph.outputs):
            if o in active:
                v = graph.values[o]
                cots[o] = [b.input(cotangent_name(o), v.shape, v.dtype)]
    for node in reversed(graph.nodes):
        gs = tuple(_total(b, cots, o) for o in node.outputs)
        if all(g is None for g in gs):
            continue
        needs = tuple(i in active for i in node.inputs)
        if not any(needs):
            continue
        rule = VJP_RULES.get(node.op)
        if rule is None:
            raise NotImplementedError(
                f"{graph.name}: node {node.name}: no VJP rule for op {node.op}"
            )
        ctx = VjpContext(
            b,
            node,
            {**get_op(node.op).attrs, **node.attrs},
            tuple(b.tensor(i) for i in node.inputs),
            tuple(b.tensor(o) for o in node.outputs),
            gs,
            needs,
        )
        with b.scope(f"grad/{node.name}"):
            grads = list(rule(ctx))
            for name, need, g in zip(node.inputs, needs, grads, strict=True):
                if need and g is not None:
                    want = graph.values[name]
                    if tuple(g.shape) != want.shape:
                        raise AssertionError(
                            f"VJP of {node.op}: gradient of {name} has shape {g.shape}, want {want.shape}"
                        )
                    if g.dtype != want.dtype:
                        g = b.cast(g, want.dtype)
                    cots.setdefault(name, []).append(g)
    return _finish(graph, b, wrt, cots, keep_outputs, prefix)


def _total(b: GraphBuilder, cots: dict[str, list[Tensor]], name: str) -> Tensor | None:
    """The sum of the cotangents of ``name`` so far (kept, so that it is built once)."""
    terms = cots.get(name)
    if not terms:
        return None
    total = terms[0]
    for t in terms[1:]:
        total = b.add(total, t)
    cots[name] = [total]
    return total


def _finish(
    graph: Graph,
    b: _BackwardBuilder,
    wrt: Sequence[str],
    cots: dict[str, list[Tensor]],
    keep_outputs: bool,
    prefix: str,
) -> Graph:
    """Name the gradients ``<prefix><value>`` and drop what no output needs."""
    renamed: dict[str, str] = {}
    outputs = list(graph.outputs) if keep_outputs else []
    with b.scope("grad"):
        for name in wrt:
            v = graph.values[name]
            g = _total(b, cots, name)
            if g is None:
                g = zeros(b, v.shape, v.dtype)
            made = {o for n in b.nodes[len(graph.nodes) :] for o in n.outputs}
            source = renamed.get(g.name, g.name)
            if source in made and source not in renamed.values():
                b.rename(source, gradient_name(name, prefix))
                renamed[source] = gradient_name(name, prefix)
            else:  # a forward value, a cotangent input or another gradient: copy it
                copy = b.op("Reshape", b.tensor(source), shape=v.shape)
                b.rename(copy.name, gradient_name(name, prefix))
            outputs.append(gradient_name(name, prefix))
    b.outputs = outputs
    editor = GraphEditor(b.graph(f"{graph.name}_grad"))
    return editor.finish()


# The rules, one module per family of ops (each registers into VJP_RULES on import).
from fusiontune.ir import _vjp_elementwise, _vjp_grad, _vjp_layout, _vjp_nn, _vjp_reduce  # noqa: E402, F401
