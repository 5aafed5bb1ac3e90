"""ONNX models as workloads, and the one function that builds any space's workload.

An :class:`OnnxSource` is everything needed to rebuild an ONNX workload anywhere (the local
evaluator, a Ray actor on another node, the confirmation stage): the model's absolute path, the
sizes that fix its dynamic dimensions and, optionally, a file of input arrays.

Inputs without a file are standard-normal floats as for the built-in workloads, except integer
inputs used as ``Gather`` indices (token ids, positions), which are drawn in range of the gathered
axis: ids in ``[0, vocab)``, never an out-of-range lookup.

An input file (``fusiontune run MODEL.onnx --inputs FILE.npz``, ``inputs = "FILE.npz"`` in a
search space) is an ``np.savez`` archive keyed by ONNX input name; keys that are not inputs are
ignored. Its arrays fix the input shapes (and with them every named dimension they share with
other inputs, see :func:`fusiontune.ir._onnx_shapes.fix_input_shapes`), and the workload, its
float64 reference included, runs on them. Each array is cast to its input's dtype when no value
changes: any float to the input's float type (float64 given for float32), integers and bools to
the input's integer type when they fit (int32 ids for int64), integers and bools to a float type
when exact, 0/1 integers to bool; anything else is an error naming the file and the key. Index
inputs must be in range of the axis they gather. An input the file lacks is drawn at random as
above when its shape is fully fixed (by the model, by the file's other arrays or by ``--dim`` /
``--input-shape``); otherwise it is an error naming the file and the input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusiontune.ir.graph import Graph, Node, Value
from fusiontune.ir.interpreter import random_inputs
from fusiontune.ir.onnx_import import InputFileError, OnnxImport
from fusiontune.ir.training import TrainSpec
from fusiontune.workloads._memory import check_fits, input_bytes, workload_bytes
from fusiontune.workloads.workload import Workload, finish_workload

ONNX_SUFFIX = ".onnx"

# Ops through which an index input keeps being an index (the importer writes Unsqueeze and
# Squeeze as Reshape): a Gather reached through them bounds the input's range.
_INDEX_PASS_THROUGH = ("Reshape", "Cast", "Transpose", "Expand", "Slice", "Concat", "Split")


@dataclass(frozen=True)
class OnnxSource:
    """An ONNX model file with its dynamic dimensions fixed.

    Attributes:
        path: the ``.onnx`` file, absolute.
        dims: symbolic dimension name -> size, as sorted pairs (picklable, hashable).
        input_shapes: input name -> whole shape, as sorted pairs.
        inputs: an ``.npz`` file of input arrays keyed by input name, absolute; None: random inputs.
    """

    path: str
    dims: tuple[tuple[str, int], ...] = ()
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    inputs: str | None = None

    @classmethod
    def make(
        cls,
        path: str | Path,
        dims: Mapping[str, int] | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        inputs: str | Path | None = None,
    ) -> OnnxSource:
        """A source from plain mappings; the paths are made absolute."""
        return cls(
            str(Path(path).resolve()),
            tuple(sorted((k, int(v)) for k, v in (dims or {}).items())),
            tuple(sorted((k, tuple(int(d) for d in v)) for k, v in (input_shapes or {}).items())),
            None if inputs is None else str(Path(inputs).resolve()),
        )

    @property
    def name(self) -> str:
        """The workload name: the file's stem."""
        return Path(self.path).stem

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the input file (every key), or {} without one.

        Raises:
            InputFileError: the file cannot be read as an ``.npz`` archive.
        """
        return {} if self.inputs is None else read_input_file(self.inputs)

    def load(self, arrays: Mapping[str, np.ndarray] | None = None, check_memory: bool = False) -> OnnxImport:
        """Import the model, its input shapes fixed by ``dims``, ``input_shapes`` and the shapes of
        ``arrays`` (the input file's, read if None); see :func:`~fusiontune.ir.onnx_import.import_model`.

        With ``check_memory``, inputs whose shapes need more memory than the machine has
        available are refused before the import allocates anything (see :meth:`describe_sizes`).
        """
        from fusiontune.ir.onnx_import import import_model

        arrays = self.arrays() if arrays is None else arrays
        return import_model(
            self.path,
            dict(self.input_shapes),
            dict(self.dims),
            arrays_file=self.inputs,
            array_shapes={k: v.shape for k, v in arrays.items()} if self.inputs is not None else None,
            check_inputs=self._check_inputs if check_memory else None,
        )

    def describe_sizes(self) -> str:
        """What fixes the model's sizes, for messages: ``model.onnx: --dim batch=8, --inputs x.npz``."""
        given = [f"--dim {k}={v}" for k, v in self.dims]
        given += [f"--input-shape {k}={'x'.join(map(str, s))}" for k, s in self.input_shapes]
        given += [f"--inputs {self.inputs}"] if self.inputs is not None else []
        return f"{self.path}: {', '.join(given)}" if given else self.path

    def _check_inputs(self, inputs: Sequence[Value], weights: int) -> None:
        check_fits(
            input_bytes(inputs) + weights,
            self.describe_sizes(),
            "inputs with their float64 copies, and weights, before any intermediate value",
        )

    def graph(self) -> Graph:
        """Import the model (see :meth:`load`)."""
        return self.load().graph


def _indexed_size(graph: Graph, node: Node, value: str) -> int | None:
    """The size of the smallest data axis ``value`` indexes when ``node`` reads it as indices
    (Gather, GatherElements, GatherND, ScatterND), else None."""
    if len(node.inputs) < 2 or node.inputs[1] != value:
        return None
    data = graph.values[node.inputs[0]].shape
    if node.op in ("Gather", "GatherElements"):
        return data[node.attr("axis", 0) % len(data)]
    if node.op in ("GatherND", "ScatterND"):
        first = node.attr("batch_dims", 0) if node.op == "GatherND" else 0
        k = graph.values[value].shape[-1]
        return min(data[first : first + k], default=1)
    return None


def index_bounds(graph: Graph) -> dict[str, int]:
    """Integer graph inputs used as indices (Gather, GatherElements, GatherND, ScatterND) -> the
    size of the smallest axis they index, so random inputs stay in range."""
    consumers = graph.consumers()
    bounds: dict[str, int] = {}
    for name in graph.inputs:
        if not np.issubdtype(np.dtype(graph.values[name].dtype), np.integer):
            continue
        frontier, seen = [name], {name}
        while frontier:
            value = frontier.pop()
            for node in consumers.get(value, []):
                bound = _indexed_size(graph, node, value)
                if bound is not None:
                    bounds[name] = min(bounds.get(name, bound), bound)
                elif node.op in _INDEX_PASS_THROUGH:
                    for out in node.outputs:
                        if out not in seen:
                            seen.add(out)
                            frontier.append(out)
    return bounds


def onnx_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for an imported model: :func:`random_inputs`, with index inputs drawn in range."""
    arrays = random_inputs(graph, seed)
    rng = np.random.default_rng([seed, 1])
    for name, bound in index_bounds(graph).items():
        v = graph.values[name]
        arrays[name] = rng.integers(0, max(bound, 1), size=v.shape).astype(v.dtype)
    return arrays


def read_input_file(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an ``np.savez`` archive, by key.

    Raises:
        InputFileError: one line naming the file (and the key): no such file, not an ``.npz``
            archive (a ``.npy`` array, a pickle, anything else), or an entry that cannot be read.
    """
    import zipfile
    import zlib

    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    try:
        loaded = np.load(p, allow_pickle=False)
    except PermissionError:
        raise InputFileError(f"{p}: permission denied") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputFileError(f"{p}: not an .npz file of arrays ({_short(e)})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise InputFileError(f"{p}: a single .npy array, expected an .npz archive keyed by input name (np.savez)")
    arrays: dict[str, np.ndarray] = {}
    with loaded:
        for key in loaded.files:
            try:
                arrays[key] = np.asarray(loaded[key])
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
                raise InputFileError(f"{p}: key {key!r}: cannot be read ({_short(e)})") from None
    return arrays


def input_file_keys(path: str | Path) -> list[str]:
    """The keys of an ``.npz`` archive, read from its directory alone ([] if it cannot be read)."""
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as loaded:
            return list(loaded.files)
    except (OSError, ValueError, EOFError, AttributeError, TypeError, zipfile.BadZipFile):
        return []


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())[:160]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def cast_input(file: str, key: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` in ``dtype`` when the cast changes no value, as ONNX inputs allow.

    Args:
        file: the input file, for messages.
        key: the array's key (the input name), for messages.
        array: the array as read.
        dtype: the input's dtype (a dtype of the IR).

    Returns:
        A C-contiguous, writable array of ``dtype``.

    Raises:
        InputFileError: a cast that would change values or that is odd (floats for an integer or
            bool input, strings, complex numbers, objects).
    """
    src, dst = array.dtype, np.dtype(dtype)
    where = f"{file}: key {key!r}"
    if src == dst:
        return np.array(array, order="C", copy=True)
    if src.kind not in "biuf":
        raise InputFileError(f"{where}: holds {src} values, the input is {dst}")
    if dst.kind == "f":
        if src.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                out = array.astype(dst)
            if np.any(np.isfinite(array) & ~np.isfinite(out)):
                raise InputFileError(f"{where}: {src} values out of the {dst} range of the input")
            return np.ascontiguousarray(out)
        out = array.astype(dst)
        if not np.array_equal(out.astype(src), array):
            raise InputFileError(f"{where}: {src} values that {dst} cannot hold exactly (the input is {dst})")
        return np.ascontiguousarray(out)
    if src.kind == "f":
        raise InputFileError(f"{where}: holds {src} values, the input is {dst}: give {dst} values")
    if dst.kind == "b":
        if not np.isin(array, (0, 1)).all():
            raise InputFileError(f"{where}: {src} values other than 0 and 1 for a bool input")
        return np.ascontiguousarray(array.astype(dst))
    if array.size and src.kind != "b":
        info = np.iinfo(dst)
        if array.min() < info.min or array.max() > info.max:
            raise InputFileError(f"{where}: {src} values out of the {dst} range of the input")
    return np.ascontiguousarray(array.astype(dst))


def file_inputs(graph: Graph, arrays: Mapping[str, np.ndarray], file: str) -> dict[str, np.ndarray]:
    """The arrays of an input file for the inputs of ``graph``: cast, shape-checked, in range.

    Args:
        graph: the imported graph (its input shapes already fixed by the arrays' shapes).
        arrays: the file's arrays by key; keys that are not graph inputs are ignored.
        file: the input file, for messages.

    Returns:
        One array per graph input the file has, in the input's dtype.

    Raises:
        InputFileError: a dtype that cannot be cast (:func:`cast_input`), a shape that differs
            from the input's, or an index input with values outside the axis it gathers.
    """
    bounds = index_bounds(graph)
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in arrays:
            continue
        v = graph.values[name]
        arr = cast_input(file, name, arrays[name], v.dtype)
        if arr.shape != v.shape:
            raise InputFileError(f"{file}: key {name!r} has shape {arr.shape}, the input has {v.shape}")
        if name in bounds and arr.size and (arr.min() < -bounds[name] or arr.max() >= bounds[name]):
            raise InputFileError(
                f"{file}: key {name!r}: indices from {arr.min()} to {arr.max()}, outside the"
                f" {bounds[name]} rows of the table the model gathers them from"
            )
        out[name] = arr
    return out


def load_onnx_workload(source: OnnxSource, seed: int = 0, train: TrainSpec | None = None) -> Workload:
    """Import the model, make its inputs (from the source's input file where it has them) and run
    the float64 reference (with ``train``: make its training step, :func:`finish_workload`).

    Memory is checked twice before it is used: once the input shapes are fixed (inputs and
    weights, before the import folds anything), and once the graph's shapes are all known
    (inputs, weights and the float64 reference of every value), before any input is drawn.

    Raises:
        OnnxImportError: as :func:`~fusiontune.ir.onnx_import.import_model`.
        InputFileError: the input file is unreadable or does not fit the model.
        UserError: the sizes need more memory than the machine has available.
    """
    arrays = source.arrays()
    imported = source.load(arrays, check_memory=True)
    graph = imported.graph
    check_fits(workload_bytes(graph), source.describe_sizes(), "inputs, weights and the float64 reference")
    inputs = onnx_inputs(graph, seed)
    if source.inputs is not None:
        inputs.update(file_inputs(graph, arrays, source.inputs))
    return finish_workload(source.name, graph, inputs, imported.dims, train)


def load_workload(
    source: str | OnnxSource, sizes: Mapping[str, int] | None = None, train: TrainSpec | None = None
) -> Workload:
    """Build a workload from a built-in name and its sizes, or from an :class:`OnnxSource`.

    With ``train``, the workload is the model's training step (:func:`training_workload`).

    Raises:
        UserError: as :func:`~fusiontune.workloads.builtin.make_workload` or the ONNX import, or a
            training step that does not fit the model (no weights, no such output...).
    """
    if isinstance(source, OnnxSource):
        return load_onnx_workload(source, train=train)
    from fusiontune.workloads.builtin import make_workload

    return make_workload(source, train=train, **dict(sizes or {}))


def workload_source(space: Any) -> str | OnnxSource:
    """The source of a search space's workload (what a Ray actor is given)."""
    return space.onnx if getattr(space, "onnx", None) is not None else space.workload


def space_workload(space: Any) -> Workload:
    """Build the workload a :class:`~fusiontune.workloads.space.SearchSpace` names, of either kind."""
    return load_workload(workload_source(space), dict(space.sizes), getattr(space, "train", None))
