"""Import an ONNX model into a fusiontune :class:`Graph` (static shapes, catalogue ops).

    graph = import_onnx("bert.onnx", dims={"batch": 2, "seq": 64})

The model is loaded with the ``onnx`` package and checked with ``onnx.checker``; then, before any
conversion work, every node is checked against the converter table (:mod:`fusiontune.ir._onnx_ops`)
so that a model with unsupported ops fails with one line naming every unsupported op type and one
node of each. Dynamic dimensions (``dim_param`` or missing) must be fixed by the caller, by name
(``dims``) or per input (``input_shapes``).

Shape subgraphs are folded at import: every node whose inputs are all known (initializers,
``Constant``, ``Shape`` of a static-shaped tensor, and anything computed from those) is evaluated
with the catalogue references, so ``Shape -> Gather -> Concat -> Reshape`` chains end as a Reshape
with a constant shape, and ``Gemm(transB=1)`` of a weight becomes a MatMul of the transposed weight.

Names: nodes keep their ONNX names (empty or repeated ones are made unique), since fusion logs and
bisection reports name nodes; a node that becomes several catalogue nodes gives its name to the
one that makes its output and ``<name>/<op>`` to the helpers. Values keep their ONNX names, and
graph outputs always do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fusiontune.errors import UserError
from fusiontune.ir.graph import DTYPES, Graph, Node, Value
from fusiontune.ir.ops import infer_node, run_reference


class OnnxImportError(UserError, ValueError):
    """A model that cannot be imported: one line naming the file and what to do."""


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
    becomes a graph constant.
    """

    def __init__(self, path: str, opset: int, reserved: set[str]) -> None:
        self.path = path
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.known: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.names: dict[str, str] = {}  # ONNX tensor name -> IR value name
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


def check_supported(model: Any, path: str) -> None:
    """Fail before any work when a node has an op type or attribute value that is not supported.

    Raises:
        OnnxImportError: one line listing every unsupported op type with one node name of each.
    """
    from fusiontune.ir._onnx_ops import unsupported_reason

    opset = default_opset(model)
    problems: dict[str, str] = {}
    if not MIN_OPSET <= opset <= MAX_OPSET:
        problems[f"opset {opset}"] = "(the model)"
    initializers = {t.name: t for t in model.graph.initializer}
    for name, node in zip(node_names(model.graph), model.graph.node, strict=True):
        reason = unsupported_reason(node, opset, initializers)
        if reason is not None and reason not in problems:
            problems[reason] = name
    if problems:
        listed = ", ".join(f"{what} (node {name})" for what, name in problems.items())
        raise OnnxImportError(f"{path}: unsupported ONNX ops: {listed}")


def _input_shape(vi: Any, given: Mapping[str, Sequence[int]], dims: Mapping[str, int], path: str) -> tuple[int, ...]:
    name = vi.name
    tt = vi.type.tensor_type
    declared = list(tt.shape.dim) if tt.HasField("shape") else None
    if name in given:
        shape = tuple(int(d) for d in given[name])
        if any(d < 0 for d in shape):
            raise OnnxImportError(f"{path}: input {name!r}: shape {shape} has a negative dimension")
        if declared is not None:
            if len(declared) != len(shape):
                raise OnnxImportError(
                    f"{path}: input {name!r} has rank {len(declared)}, the given shape {shape} has rank {len(shape)}"
                )
            for i, (d, s) in enumerate(zip(declared, shape, strict=True)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != s:
                    raise OnnxImportError(
                        f"{path}: input {name!r} dimension {i} is {d.dim_value} in the model, the given shape says {s}"
                    )
        return shape
    if declared is None:
        raise OnnxImportError(f"{path}: input {name!r} has no shape in the model: give it with --input-shape {name}=...")
    shape = []
    for i, d in enumerate(declared):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        elif d.dim_param and d.dim_param in dims:
            shape.append(int(dims[d.dim_param]))
        else:
            what = f"dimension {i} ({d.dim_param!r})" if d.dim_param else f"dimension {i} (unnamed)"
            fix = f"--dim {d.dim_param}=N" if d.dim_param else f"--input-shape {name}=..."
            raise OnnxImportError(f"{path}: input {name!r} {what} is dynamic: fix it with {fix}")
    return tuple(shape)


def _graph_inputs(model: Any) -> list[Any]:
    """The real inputs (old models also list their initializers as inputs)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def used_dim_names(model: Any) -> set[str]:
    return {d.dim_param for vi in _graph_inputs(model) for d in vi.type.tensor_type.shape.dim if d.dim_param}


# ---- the entry point -------------------------------------------------------------------------
def import_onnx(
    path: str | os.PathLike[str],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> Graph:
    """Import an ONNX model file as a static-shape graph of catalogue ops.

    Args:
        path: the ``.onnx`` file (weights inside it; external data next to it also loads).
        input_shapes: whole shapes per graph input name, overriding the model's.
        dims: sizes of symbolic dimensions (``dim_param``), e.g. ``{"batch": 2, "seq": 64}``.

    Returns:
        The graph, named after the file's stem; its outputs keep their ONNX names.

    Raises:
        OnnxImportError: the file is missing or not ONNX, fails ``onnx.checker``, has unsupported
            ops (all listed, before any work), a dynamic dimension left unfixed, an unknown name
            in ``input_shapes`` or ``dims``, or a tensor that must be constant and is not.
    """
    from fusiontune.ir._onnx_ops import CONVERTERS, attributes

    onnx = _onnx()
    spath = str(path)
    model = load_model(path)
    check_supported(model, spath)
    given = dict(input_shapes or {})
    dims = dict(dims or {})
    real_inputs = _graph_inputs(model)
    input_names = [vi.name for vi in real_inputs]
    for name in given:
        if name not in input_names:
            raise OnnxImportError(f"{spath}: --input-shape {name}: no such input (inputs: {', '.join(input_names)})")
    used = used_dim_names(model)
    for name in dims:
        if name not in used:
            known = ", ".join(sorted(used)) or "none"
            raise OnnxImportError(f"{spath}: --dim {name}: no input dimension has this name (named dimensions: {known})")
    g = model.graph
    reserved = {t.name for t in g.initializer} | {vi.name for vi in g.input} | {o for n in g.node for o in n.output}
    imp = Importer(spath, default_opset(model), reserved)
    for t in g.initializer:
        imp.current = t.name
        arr = onnx.numpy_helper.to_array(t)
        if arr.dtype.kind in "iu" and str(arr.dtype) not in DTYPES:
            arr = arr.astype(np.int64)  # small integer tensors (uint8 masks, int8 indices)
        imp.names[t.name] = imp.bind_known(t.name, arr)
    for vi in real_inputs:
        elem = vi.type.tensor_type.elem_type
        dtype = np_dtype(elem)
        if dtype not in DTYPES:
            raise OnnxImportError(f"{spath}: input {vi.name!r} has dtype {dtype} (supported: {', '.join(DTYPES)})")
        shape = _input_shape(vi, given, dims, spath)
        imp.values[vi.name] = Value(vi.name, shape, dtype)
        imp.inputs.append(vi.name)
        imp.names[vi.name] = vi.name
    for name, node in zip(node_names(g), g.node, strict=True):
        imp.current = name
        ins = [imp.names[i] if i else None for i in node.input]
        for onnx_in, ir in zip(node.input, ins, strict=True):
            if onnx_in and ir is None:
                raise imp.fail(f"reads {onnx_in!r}, which nothing produces")
        outs = CONVERTERS[node.op_type](imp, node, ins, attributes(node))
        for onnx_out, ir in zip(node.output, outs, strict=False):
            if onnx_out:
                imp.names[onnx_out] = ir
    missing = [o.name for o in g.output if o.name not in imp.names]
    if missing:
        raise OnnxImportError(f"{spath}: graph output {missing[0]!r} is never produced")
    return imp.finish(Path(spath).stem, [o.name for o in g.output])
