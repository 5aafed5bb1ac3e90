"""Import an ONNX model into a fusiontune :class:`Graph` (static shapes, catalogue ops).

    graph = import_onnx("bert.onnx", dims={"batch": 2, "seq": 64})

The model is loaded with the ``onnx`` package and checked with ``onnx.checker``. Dynamic
dimensions (``dim_param`` or missing) must be fixed by the caller: by name (``dims``), per input
(``input_shapes``) or by the arrays the model will run on (``array_shapes``, from an input file).
A named dimension fixed anywhere is fixed for every input that names it (``input_ids`` of shape
2x16 fixes ``attention_mask``'s ``batch`` and ``seq``); two sources that disagree are an error.

Import folds first. With the input shapes fixed, every node is either *known* (``Shape`` and
``Size``, ``Constant``, and any node whose inputs are all known: initializers and outputs of known
nodes) or *live* (it depends on a graph input); see :mod:`fusiontune.ir._onnx_fold`. Only live
nodes must have a converter (:mod:`fusiontune.ir._onnx_ops`): before any conversion work, a
model with live nodes that cannot be converted (or known nodes that cannot be evaluated) fails
with one line naming every unsupported op type, one node of each, and the model's opset. Known
nodes are evaluated during import: through their converter when it takes them (its catalogue
nodes fold at once, so ``Shape -> Gather -> Concat -> Reshape`` chains end as a Reshape with a
constant shape, and ``Gemm(transB=1)`` of a weight becomes a MatMul of the transposed weight),
otherwise through ``onnx.reference``, so a constant-only subgraph of any standard op (the mask
construction of transformers exports over ``Shape`` / ``Range`` / ``ConstantOfShape`` outputs, an
If or a Loop on constants) never blocks a model. Known values the IR has no dtype for (uint8 or
int8 tensors, sequences) stay outside the graph; an integer one read by a live node becomes int64.

Names: nodes keep their ONNX names (empty or repeated ones are made unique), since fusion logs and
bisection reports name nodes; a node that becomes several catalogue nodes gives its name to the
one that makes its output and ``<name>/<op>`` to the helpers; a folded node makes no node. Values
keep their ONNX names, and graph outputs always do.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from fusiontune.errors import UserError
from fusiontune.ir._onnx_fold import (
    ReferenceFolder,
    describe_value,
    is_default_domain,
    live_nodes,
    subgraph_reads,
)
from fusiontune.ir.graph import DTYPES, Graph, Node, Value
from fusiontune.ir.ops import infer_node, run_reference


class OnnxImportError(UserError, ValueError):
    """A model that cannot be imported: one line naming the file and what to do."""


class InputFileError(OnnxImportError):
    """A file of input arrays that does not fit the model: one line naming the file and the key."""


MIN_OPSET, MAX_OPSET = 6, 22
"""Default-domain opsets the converters follow (6 to 21 are tested through the onnx backend data)."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a core dependency
        raise OnnxImportError("importing ONNX models needs the onnx package: pip install onnx") from None
    return onnx


def np_dtype(elem_type: int) -> str:
    """The dtype name of an ONNX ``TensorProto`` element type, e.g. ``1 -> 'float32'``."""
    onnx = _onnx()
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return f"elem_type {elem_type}"


# ---- the importer state ----------------------------------------------------------------------
class Importer:
    """What the converters see: known (constant) tensors, values, and the nodes emitted so far.

    Every tensor has an IR value name. A tensor whose contents are known at import time lives in
    :attr:`known`; a node whose inputs are all known is evaluated at once (:meth:`emit`), so only
    the computation that depends on a graph input becomes nodes. A known tensor read by a node
    becomes a graph constant. Known values the IR has no dtype for (a uint8 tensor, a sequence)
    live in :attr:`opaque`, by ONNX name, for the nodes onnx.reference evaluates.
    """

    def __init__(self, path: str, opset: int, reserved: set[str]) -> None:
        self.path = path
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.known: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.names: dict[str, str] = {}  # ONNX tensor name -> IR value name
        self.opaque: dict[str, Any] = {}  # ONNX tensor name -> known value the IR cannot hold
        self._taken = set(reserved)
        self._node_names: set[str] = set()
        self.current = ""  # the ONNX node being converted

    # ---- naming ----------------------------------------------------------------------------
    def fresh(self, stem: str) -> str:
        """A value name not used by the model or the import so far."""
        i = 0
        name = stem
        while name in self._taken or name in self.values:
            i += 1
            name = f"{stem}_{i}"
        self._taken.add(name)
        return name

    def _node_name(self, tag: str | None) -> str:
        base = self.current if tag is None else f"{self.current}/{tag}"
        name, i = base, 0
        while name in self._node_names:
            i += 1
            name = f"{base}_{i}"
        self._node_names.add(name)
        return name

    def fail(self, message: str) -> OnnxImportError:
        return OnnxImportError(f"{self.path}: node {self.current}: {message}")

    # ---- tensors ---------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        return self.values[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name].shape

    def dtype(self, name: str) -> str:
        return self.values[name].dtype

    def const(self, array: Any, stem: str = "const", dtype: str | None = None) -> str:
        """A known tensor with a fresh name."""
        arr = np.asarray(array, dtype=dtype)
        if str(arr.dtype) not in DTYPES:
            raise self.fail(f"tensor of dtype {arr.dtype} (supported: {', '.join(DTYPES)})")
        name = self.fresh(f"{self.current}/{stem}" if self.current else stem)
        self.known[name] = arr
        self.values[name] = Value(name, tuple(int(d) for d in arr.shape), str(arr.dtype))
        return name

    def bind_known(self, name: str, array: np.ndarray) -> str:
        """Record ``array`` as the known tensor ``name`` (an initializer or a folded output)."""
        arr = np.asarray(array)
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            # numpy_helper returns read-only views of the protobuf; kernels take writable arrays
            arr = np.array(arr, order="C", copy=True)
        if str(arr.dtype) not in DTYPES:
            raise self.fail(f"tensor {name!r} of dtype {arr.dtype} (supported: {', '.join(DTYPES)})")
        self.known[name] = arr
        self.values[name] = Value(name, tuple(int(d) for d in arr.shape), str(arr.dtype))
        return name

    def bind_onnx(self, onnx_name: str, value: Any) -> None:
        """Record a known ONNX tensor (an initializer, a folded output): in the IR when its dtype is
        one, else as an opaque value."""
        if isinstance(value, np.ndarray) and str(value.dtype) in DTYPES:
            self.opaque.pop(onnx_name, None)
            self.names[onnx_name] = self.bind_known(onnx_name, value)
        else:
            self.names.pop(onnx_name, None)
            self.opaque[onnx_name] = value

    def read(self, onnx_name: str) -> str:
        """The IR value of an ONNX tensor that a converter reads.

        An opaque integer tensor becomes int64 (the IR's integer: uint8 masks, int8 indices).

        Raises:
            OnnxImportError: nothing produces it, or it is a known value the IR cannot hold.
        """
        if onnx_name in self.names:
            return self.names[onnx_name]
        if onnx_name in self.opaque:
            value = self.opaque[onnx_name]
            if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
                self.names[onnx_name] = self.bind_known(onnx_name, value.astype(np.int64))
                return self.names[onnx_name]
            raise self.fail(f"reads {onnx_name!r}, a constant {describe_value(value)}, which fusiontune's IR cannot hold")
        raise self.fail(f"reads {onnx_name!r}, which nothing produces")

    def known_value(self, onnx_name: str) -> Any:
        """The contents of a known ONNX tensor (its exact ONNX dtype when the IR has none)."""
        if onnx_name in self.opaque:
            return self.opaque[onnx_name]
        return self.known[self.names[onnx_name]]

    def constant_of(self, name: str | None, what: str) -> np.ndarray:
        """The contents of a tensor that must be known at import (a shape, axes, a bound)."""
        if name is None or name not in self.known:
            raise self.fail(f"{what} must be a constant (it depends on a graph input)")
        return self.known[name]

    def emit(
        self,
        op: str,
        inputs: Sequence[str],
        attrs: Mapping[str, Any] | None = None,
        outputs: Sequence[str] | None = None,
        n_out: int = 1,
        tag: str | None = None,
    ) -> list[str]:
        """Add a catalogue node, or evaluate it at once when all its inputs are known.

        Args:
            op: the catalogue op.
            inputs: IR value names.
            attrs: the node's attributes.
            outputs: the value names to give the outputs (an ONNX node's outputs); fresh if None.
            n_out: number of outputs when ``outputs`` is None.
            tag: None for the node that stands for the ONNX node (it takes the ONNX name);
                otherwise a helper, named ``<onnx name>/<tag>``.

        Returns:
            The output value names.
        """
        attrs = dict(attrs or {})
        if outputs is None:
            stem = f"{self.current}/{tag or op}"
            outputs = [self.fresh(stem) for _ in range(n_out)]
        else:
            outputs = [o if o not in self.values else self.fresh(o) for o in outputs]
            self._taken.update(outputs)
        node = Node(self._node_name(tag), op, tuple(inputs), tuple(outputs), attrs, origin=(self.current,))
        try:
            shapes = infer_node(node, [self.values[i] for i in inputs])
        except ValueError as e:
            raise self.fail(str(e)) from None
        if inputs and all(i in self.known for i in inputs):
            arrays = run_reference(node, [self.known[i] for i in inputs])
            for o, arr, (shape, dtype) in zip(outputs, arrays, shapes, strict=True):
                self.bind_known(o, np.asarray(arr).astype(dtype, copy=False).reshape(shape))
            return list(outputs)
        for o, (shape, dtype) in zip(outputs, shapes, strict=True):
            self.values[o] = Value(o, shape, dtype)
        self.nodes.append(node)
        return list(outputs)

    def reshape(self, x: str, shape: Sequence[int], outputs: Sequence[str] | None = None, tag: str | None = "reshape") -> str:
        """``x`` with a new static shape (no node when the shape is unchanged and no name is asked)."""
        shape = tuple(int(d) for d in shape)
        if shape == self.shape(x) and outputs is None:
            return x
        return self.emit("Reshape", [x], {"shape": shape}, outputs, tag=tag)[0]

    def cast_like(self, x: str, dtype: str) -> str:
        """``x`` in ``dtype`` (a folded cast when it is known)."""
        if self.dtype(x) == dtype:
            return x
        return self.emit("Cast", [x], {"to": dtype}, tag="cast")[0]

    # ---- the result ------------------------------------------------------------------------
    def finish(self, name: str, outputs: Sequence[str]) -> Graph:
        """The graph: ONNX outputs keep their names, even when they are constants or aliases."""
        final: list[str] = []
        for onnx_name in outputs:
            ir = self.names[onnx_name]
            if ir == onnx_name and ir not in self.known and ir not in self.inputs:
                final.append(ir)
                continue
            self.current = f"output/{onnx_name}"
            if ir == onnx_name:  # a known tensor or an input under the output's name: rename it
                src = self.fresh(f"{onnx_name}/value")
                self.values[src] = Value(src, self.values[ir].shape, self.values[ir].dtype)
                if ir in self.known:
                    self.known[src] = self.known.pop(ir)
                else:
                    raise OnnxImportError(f"{self.path}: graph input {ir!r} is also a graph output")
                del self.values[ir]
                ir = src
            node = Node(self._node_name(None), "Reshape", (ir,), (onnx_name,), {"shape": self.shape(ir)})
            self.values[onnx_name] = Value(onnx_name, self.shape(ir), self.dtype(ir))
            self.nodes.append(node)
            final.append(onnx_name)
        read = {i for n in self.nodes for i in n.inputs}
        constants = {k: v for k, v in self.known.items() if k in read}
        live = set(self.inputs) | set(constants) | {o for n in self.nodes for o in n.outputs}
        graph = Graph(
            name=name,
            values={k: v for k, v in self.values.items() if k in live},
            nodes=tuple(self.nodes),
            inputs=tuple(self.inputs),
            outputs=tuple(final),
            constants=constants,
        )
        try:
            graph.validate()
        except ValueError as e:  # a converter bug, not the user's: still one line
            raise OnnxImportError(f"{self.path}: imported graph is not valid: {e}") from None
        return graph


# ---- loading and checking --------------------------------------------------------------------
def load_model(path: str | os.PathLike[str]) -> Any:
    """Load and check an ONNX model file.

    Raises:
        OnnxImportError: no such file, not an ONNX protobuf, or ``onnx.checker`` rejects it.
    """
    onnx = _onnx()
    p = Path(path)
    if not p.is_file():
        raise OnnxImportError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    try:
        model = onnx.load(str(p))
    except Exception as e:  # protobuf's DecodeError and friends
        raise OnnxImportError(f"{p}: not an ONNX model ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    if not model.graph.node and not model.graph.output:
        raise OnnxImportError(f"{p}: not an ONNX model (no graph)")
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # onnx.checker.ValidationError, or a C++ error for odd files
        first = " ".join(str(e).split())[:300]
        raise OnnxImportError(f"{p}: fails onnx.checker: {first}") from None
    return model


def default_opset(model: Any) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return MAX_OPSET


def node_names(graph: Any) -> list[str]:
    """Unique, non-empty names for the nodes of an ONNX graph, in node order."""
    seen: set[str] = set()
    out: list[str] = []
    for i, n in enumerate(graph.node):
        base = n.name or f"{n.op_type}_{i}"
        name, k = base, 0
        while name in seen:
            k += 1
            name = f"{base}_{k}"
        seen.add(name)
        out.append(name)
    return out


def check_supported(
    model: Any, path: str, live: Sequence[bool] | None = None, folder: ReferenceFolder | None = None
) -> None:
    """Fail before any work when a node cannot be imported.

    A live node (one that depends on a graph input) needs a converter that takes its op type and
    attribute values; a known node (constants and static shapes only) needs its converter or an
    ``onnx.reference`` implementation.

    Args:
        model: the loaded ``ModelProto``.
        path: the model file, for the message.
        live: one flag per node (:func:`fusiontune.ir._onnx_fold.live_nodes`); computed if None.
        folder: the reference evaluator of the model; made if None.

    Raises:
        OnnxImportError: one line with the model's opset, listing every unsupported op type with
            one node name of each.
    """
    from fusiontune.ir._onnx_ops import unsupported_reason

    opset = default_opset(model)
    if live is None:
        live = live_nodes(model.graph, [vi.name for vi in graph_inputs(model)])
    folder = folder or ReferenceFolder(model)
    problems: dict[str, str] = {}
    initializers = {t.name: t for t in model.graph.initializer}
    for name, node, is_live in zip(node_names(model.graph), model.graph.node, live, strict=True):
        reason = unsupported_reason(node, opset, initializers)
        if reason is not None and not is_live:
            reason = folder.unavailable(node)
        if reason is not None and reason not in problems:
            problems[reason] = name
    parts = []
    if not MIN_OPSET <= opset <= MAX_OPSET:
        parts.append(f"opset {opset} is not supported (opsets {MIN_OPSET} to {MAX_OPSET} are)")
    if problems:
        listed = ", ".join(f"{what} (node {name})" for what, name in problems.items())
        parts.append(f"unsupported ONNX ops (model opset {opset}): {listed}")
    if parts:
        raise OnnxImportError(f"{path}: {'; '.join(parts)}")


def weight_bytes(model: Any) -> int:
    """Bytes of the model's initializers as arrays, from their dims (nothing is converted)."""
    onnx = _onnx()
    total = 0
    for t in model.graph.initializer:
        try:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        except (KeyError, TypeError, ValueError):  # strings and other odd tensors: count a byte each
            itemsize = 1
        total += math.prod(int(d) for d in t.dims) * itemsize
    return total


def graph_inputs(model: Any) -> list[Any]:
    """The real inputs (old models also list their initializers as inputs)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def used_dim_names(model: Any) -> set[str]:
    """The named dimensions (``dim_param``) of the model's inputs."""
    return {d.dim_param for vi in graph_inputs(model) for d in vi.type.tensor_type.shape.dim if d.dim_param}


# ---- converting ------------------------------------------------------------------------------
def _fold_node(imp: Importer, folder: ReferenceFolder, node: Any, initializers: Mapping[str, Any]) -> None:
    """Evaluate a known node: through its converter when it takes the node (its catalogue nodes
    fold at once), else through onnx.reference. Its outputs become known values."""
    from fusiontune.ir._onnx_ops import CONVERTERS, attributes, unsupported_reason

    converter = CONVERTERS.get(node.op_type) if is_default_domain(node) else None
    readable = all(not i or i in imp.names for i in node.input)
    error: OnnxImportError | None = None
    if converter is not None and readable and unsupported_reason(node, imp.opset, initializers) is None:
        mark = len(imp.nodes)
        ins = [imp.names[i] if i else None for i in node.input]
        try:
            outs = converter(imp, node, ins, attributes(node))
        except OnnxImportError as e:  # onnx.reference may still manage; else this is the error
            error = e
        else:
            if all(o in imp.known for o in outs):
                for onnx_out, ir in zip(node.output, outs, strict=False):
                    if onnx_out:
                        imp.names[onnx_out] = ir
                return
        del imp.nodes[mark:]  # a converter that emitted nodes on constants: evaluate it instead
    feeds = {}
    for i in [i for i in node.input if i] + sorted(subgraph_reads(node)):
        if i in imp.opaque or imp.names.get(i) in imp.known:
            feeds[i] = imp.known_value(i)
        else:  # the live input of a Shape or Size: only its shape is read
            v = imp.value(imp.names[i])
            # a zero-stride view: the shape without the bytes (a large batch must not allocate)
            feeds[i] = np.broadcast_to(np.zeros((), v.dtype), v.shape)
    try:
        results = folder.evaluate(node, feeds)
    except Exception as e:  # noqa: BLE001 - onnx.reference raises anything; the user gets one line
        if error is not None:
            raise error from None
        detail = " ".join(str(e).split())[:200]
        raise imp.fail(f"{node.op_type} on constants: onnx.reference failed ({type(e).__name__}: {detail})") from None
    for onnx_out, value in results.items():
        imp.bind_onnx(onnx_out, value)


@dataclass(frozen=True)
class OnnxImport:
    """An imported model: the graph and the sizes its inputs were fixed to.

    Attributes:
        graph: the static-shape graph of catalogue ops.
        input_shapes: graph input name -> its shape.
        dims: every named input dimension (``dim_param``) -> its size.
        opset: the model's default-domain opset.
    """

    graph: Graph
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    opset: int = MAX_OPSET

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shapes", MappingProxyType(dict(self.input_shapes)))
        object.__setattr__(self, "dims", MappingProxyType(dict(self.dims)))


# ---- the entry points ------------------------------------------------------------------------
def import_model(
    path: str | os.PathLike[str],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    *,
    arrays_file: str | os.PathLike[str] | None = None,
    array_shapes: Mapping[str, Sequence[int]] | None = None,
    check_inputs: Callable[[Sequence[Value], int], None] | None = None,
) -> OnnxImport:
    """Import an ONNX model file as a static-shape graph of catalogue ops.

    Args:
        path: the ``.onnx`` file (weights inside it; external data next to it also loads).
        input_shapes: whole shapes per graph input name (``--input-shape``).
        dims: sizes of symbolic dimensions (``dim_param``), e.g. ``{"batch": 2, "seq": 64}``.
        arrays_file: the file of input arrays ``array_shapes`` describe (for messages).
        array_shapes: the shapes of the arrays the model will run on, by input name; keys that
            are not inputs are ignored. See :func:`fusiontune.ir._onnx_shapes.fix_input_shapes`.
        check_inputs: called with the graph inputs (their static shapes fixed) and the bytes of
            the model's weights once the shapes are known, before the import allocates anything
            for them (folding ``ConstantOfShape`` of a batch dimension does); it raises to refuse.

    Returns:
        The graph (named after the file's stem; its outputs keep their ONNX names), with the
        input shapes and named dimensions it was imported with.

    Raises:
        OnnxImportError: the file is missing or not ONNX, fails ``onnx.checker``, has unsupported
            ops (all listed, before any work), a dynamic dimension left unfixed, an unknown name
            in ``input_shapes`` or ``dims``, or a tensor that must be constant and is not.
        InputFileError: an array shape that does not fit the model or the other shapes.
    """
    from fusiontune.ir._onnx_ops import CONVERTERS, attributes
    from fusiontune.ir._onnx_shapes import fix_input_shapes

    onnx = _onnx()
    spath = str(path)
    model = load_model(path)
    g = model.graph
    real_inputs = graph_inputs(model)
    folder = ReferenceFolder(model)
    live = live_nodes(g, [vi.name for vi in real_inputs])
    check_supported(model, spath, live, folder)
    shapes, fixed_dims = fix_input_shapes(
        model, spath, input_shapes, dims, None if arrays_file is None else str(arrays_file), array_shapes
    )
    input_values = []
    for vi in real_inputs:
        dtype = np_dtype(vi.type.tensor_type.elem_type)
        if dtype not in DTYPES:
            raise OnnxImportError(f"{spath}: input {vi.name!r} has dtype {dtype} (supported: {', '.join(DTYPES)})")
        input_values.append(Value(vi.name, shapes[vi.name], dtype))
    if check_inputs is not None:
        check_inputs(input_values, weight_bytes(model))
    reserved = {t.name for t in g.initializer} | {vi.name for vi in g.input} | {o for n in g.node for o in n.output}
    opset = default_opset(model)
    imp = Importer(spath, opset, reserved)
    initializers = {t.name: t for t in g.initializer}
    for t in g.initializer:
        imp.current = t.name
        imp.bind_onnx(t.name, onnx.numpy_helper.to_array(t))
    for value in input_values:
        imp.values[value.name] = value
        imp.inputs.append(value.name)
        imp.names[value.name] = value.name
    for name, node, is_live in zip(node_names(g), g.node, live, strict=True):
        imp.current = name
        if not is_live:
            _fold_node(imp, folder, node, initializers)
            continue
        ins = [imp.read(i) if i else None for i in node.input]
        outs = CONVERTERS[node.op_type](imp, node, ins, attributes(node))
        for onnx_out, ir in zip(node.output, outs, strict=False):
            if onnx_out:
                imp.names[onnx_out] = ir
    for o in g.output:
        if o.name not in imp.names and o.name in imp.opaque:
            imp.current = f"output/{o.name}"
            imp.read(o.name)
    missing = [o.name for o in g.output if o.name not in imp.names]
    if missing:
        raise OnnxImportError(f"{spath}: graph output {missing[0]!r} is never produced")
    graph = imp.finish(Path(spath).stem, [o.name for o in g.output])
    return OnnxImport(graph, shapes, fixed_dims, opset)


def import_onnx(
    path: str | os.PathLike[str],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> Graph:
    """The graph of :func:`import_model` (same arguments, same errors)."""
    return import_model(path, input_shapes, dims).graph
