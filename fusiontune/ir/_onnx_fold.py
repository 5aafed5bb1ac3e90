"""Import-time constant folding of ONNX nodes: which nodes depend on live data, and onnx.reference.

With the input shapes fixed, an ONNX node is *known* (its outputs can be computed at import) when
it is ``Shape`` or ``Size`` (static shapes), or when every tensor it reads (its inputs, and the
outer-scope names its If / Loop / Scan bodies read) is known: an initializer, a ``Constant`` or the
output of a known node. Every other node is *live*: it depends on a graph input and becomes part
of the imported graph. The random ops are always live (folding would freeze one draw).

Known nodes that no converter handles are evaluated with onnx's own reference implementation
(:mod:`onnx.reference`), one node at a time, so constant-only subgraphs of any standard op (the
mask construction of transformers exports: Range, CumSum, comparisons, And / Not, GatherND over
Shape / ConstantOfShape outputs) never block an import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SHAPE_OPS = frozenset({"Shape", "Size"})
"""Ops whose outputs are known whatever their input: every shape is static after import."""

RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
"""Ops never folded, even on constants: each run draws anew."""

_DEFAULT_DOMAINS = ("", "ai.onnx")

_REFERENCE_OPS = {
    "": "onnx.reference.ops",
    "ai.onnx.ml": "onnx.reference.ops.aionnxml",
    "ai.onnx.preview": "onnx.reference.ops.aionnx_preview",
    "ai.onnx.preview.training": "onnx.reference.ops.aionnx_preview_training",
    "experimental": "onnx.reference.ops.experimental",
}
"""The onnx.reference module that holds each domain's op implementations."""


def is_default_domain(node: Any) -> bool:
    """Whether ``node`` is an op of the default ONNX domain."""
    return node.domain in _DEFAULT_DOMAINS


def _subgraphs(node: Any) -> list[Any]:
    import onnx

    graphs: list[Any] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            graphs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(a.graphs)
    return graphs


def subgraph_reads(node: Any) -> set[str]:
    """The names that ``node``'s subgraphs (If branches, Loop / Scan bodies) read from the scopes
    around it (none for a node without subgraphs)."""
    reads: set[str] = set()
    for graph in _subgraphs(node):
        defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        defined |= {t.values.name for t in graph.sparse_initializer}
        for inner in graph.node:
            reads.update(i for i in inner.input if i and i not in defined)
            reads.update(subgraph_reads(inner) - defined)
            defined.update(o for o in inner.output if o)
    return reads


def live_nodes(graph: Any, inputs: Iterable[str]) -> list[bool]:
    """For each node of an ONNX graph, in order: whether it depends on live data.

    Args:
        graph: the ``GraphProto`` (nodes in topological order, as ``onnx.checker`` requires).
        inputs: the names of its live inputs (graph inputs that are not initializers).

    Returns:
        One flag per node: True when the node reads (directly, or through a subgraph) a value
        computed from a graph input, or is a random op; False when it can be evaluated at import.
    """
    live = set(inputs)
    flags: list[bool] = []
    for node in graph.node:
        if is_default_domain(node) and node.op_type in SHAPE_OPS:
            is_live = False
        elif is_default_domain(node) and node.op_type in RANDOM_OPS:
            is_live = True
        else:
            reads = {i for i in node.input if i} | subgraph_reads(node)
            is_live = not reads.isdisjoint(live)
        if is_live:
            live.update(o for o in node.output if o)
        flags.append(is_live)
    return flags


class ReferenceFolder:
    """Evaluates single ONNX nodes on known values with :class:`onnx.reference.ReferenceEvaluator`.

    Args:
        model: the ``ModelProto``: its opsets and its model-local functions are used.
    """

    def __init__(self, model: Any) -> None:
        self.opsets = {d.domain or "": int(d.version) for d in model.opset_import}
        if "ai.onnx" in self.opsets:
            self.opsets.setdefault("", self.opsets.pop("ai.onnx"))
        self._function_protos = list(model.functions)
        self._functions: list[Any] | None = None

    def function_keys(self) -> set[tuple[str, str]]:
        """``(domain, name)`` of the model-local functions."""
        return {(f.domain, f.name) for f in self._function_protos}

    def unavailable(self, node: Any) -> str | None:
        """Why onnx.reference cannot evaluate ``node`` (its qualified op type), or None when it can."""
        import importlib

        from onnx.reference import op_run

        domain = "" if is_default_domain(node) else node.domain
        qualified = f"{domain}.{node.op_type}" if domain else node.op_type
        if (domain, node.op_type) in self.function_keys():
            return None
        module = _REFERENCE_OPS.get(domain)
        version = self.opsets.get(domain)
        if module is None or version is None:
            return qualified
        try:
            importlib.import_module(module).load_op(domain, node.op_type, version)
        except op_run.RuntimeContextError:
            return None  # an implementation chosen from the input types, which evaluate() gives
        except Exception:  # noqa: BLE001 - NotImplementedError, or no schema for the op
            return qualified
        return None

    def evaluate(self, node: Any, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The outputs of ``node`` on ``feeds``.

        Args:
            node: the ``NodeProto``.
            feeds: a value for every name the node reads (its non-empty inputs and the names its
                subgraphs read from the enclosing scopes): arrays, lists (sequences) or None.

        Returns:
            Output name -> value, for each non-empty output.

        Raises:
            Exception: whatever onnx.reference raises (the caller turns it into one line).
        """
        import onnx
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        feeds = dict(feeds)
        loop_without_cond = node.op_type == "Loop" and (len(node.input) < 2 or not node.input[1])
        if node.domain == "ai.onnx" or loop_without_cond:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.domain = ""
            if loop_without_cond:
                # onnx.reference (1.23) runs no iteration when Loop's optional cond is omitted
                # (None is false); an omitted cond means true, so give it one.
                cond = "fold/loop_cond"
                while cond in feeds:
                    cond += "_"
                while len(copy.input) < 2:
                    copy.input.append("")
                copy.input[1] = cond
                feeds[cond] = np.array(True)
            node = copy
        if self._functions is None:
            self._functions = []
            for f in self._function_protos:  # functions may call the ones before them
                self._functions.append(ReferenceEvaluator(f, functions=list(self._functions)))
        outputs = [o for o in node.output if o]
        graph = helper.make_graph(
            [node],
            "fold",
            [_value_info(name, value) for name, value in feeds.items()],
            [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        )
        evaluator = ReferenceEvaluator(graph, opsets=dict(self.opsets), functions=list(self._functions))
        with np.errstate(all="ignore"):
            results = evaluator.run(None, feeds)
        return {o: _as_value(r) for o, r in zip(outputs, results, strict=True)}


def _value_info(name: str, value: Any) -> Any:
    """A graph input's declaration: its tensor type when it is an array, untyped otherwise."""
    import onnx
    from onnx import helper

    if isinstance(value, np.ndarray):
        try:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        except (KeyError, TypeError, ValueError):
            return helper.make_value_info(name, onnx.TypeProto())
        return helper.make_tensor_value_info(name, elem, list(value.shape))
    return helper.make_value_info(name, onnx.TypeProto())


def _as_value(result: Any) -> Any:
    if isinstance(result, np.generic):
        return np.asarray(result)
    if isinstance(result, Sequence) and not isinstance(result, (str, bytes)):
        return [_as_value(r) for r in result]
    return result


def describe_value(value: Any) -> str:
    """A few words on a known value the IR cannot hold: ``uint8 tensor``, ``sequence``, ..."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} tensor"
    if value is None:
        return "empty optional"
    if isinstance(value, list):
        return "sequence"
    return type(value).__name__
