"""ONNX models as workloads, and the one function that builds any space's workload.

An :class:`OnnxSource` is everything needed to rebuild an ONNX workload anywhere (the local
evaluator, a Ray actor on another node, the confirmation stage): the model's absolute path and the
sizes that fix its dynamic dimensions. Its inputs are standard-normal floats as for the built-in
workloads, except integer inputs used as ``Gather`` indices (token ids, positions), which are
drawn in range of the gathered axis: ids in ``[0, vocab)``, never an out-of-range lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.workloads.workload import Workload

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
    """

    path: str
    dims: tuple[tuple[str, int], ...] = ()
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def make(
        cls,
        path: str | Path,
        dims: Mapping[str, int] | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> OnnxSource:
        """A source from plain mappings; the path is made absolute."""
        return cls(
            str(Path(path).resolve()),
            tuple(sorted((k, int(v)) for k, v in (dims or {}).items())),
            tuple(sorted((k, tuple(int(d) for d in v)) for k, v in (input_shapes or {}).items())),
        )

    @property
    def name(self) -> str:
        """The workload name: the file's stem."""
        return Path(self.path).stem

    def graph(self) -> Graph:
        """Import the model (see :func:`fusiontune.ir.onnx_import.import_onnx`)."""
        from fusiontune.ir.onnx_import import import_onnx

        return import_onnx(self.path, dict(self.input_shapes), dict(self.dims))


def index_bounds(graph: Graph) -> dict[str, int]:
    """Integer graph inputs used as Gather indices -> the size of the smallest gathered axis."""
    consumers = graph.consumers()
    bounds: dict[str, int] = {}
    for name in graph.inputs:
        if not np.issubdtype(np.dtype(graph.values[name].dtype), np.integer):
            continue
        frontier, seen = [name], {name}
        while frontier:
            value = frontier.pop()
            for node in consumers.get(value, []):
                if node.op == "Gather" and node.inputs[1] == value:
                    data = graph.values[node.inputs[0]]
                    axis = node.attr("axis", 0) % len(data.shape)
                    bounds[name] = min(bounds.get(name, data.shape[axis]), data.shape[axis])
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


def load_onnx_workload(source: OnnxSource, seed: int = 0) -> Workload:
    """Import the model, make its inputs and run the float64 reference.

    Raises:
        OnnxImportError: as :func:`~fusiontune.ir.onnx_import.import_onnx`.
    """
    graph = source.graph()
    inputs = onnx_inputs(graph, seed)
    reference = run_graph(graph, inputs, "float64")
    return Workload(source.name, graph, inputs, reference, dict(source.dims))


def load_workload(source: str | OnnxSource, sizes: Mapping[str, int] | None = None) -> Workload:
    """Build a workload from a built-in name and its sizes, or from an :class:`OnnxSource`.

    Raises:
        UserError: as :func:`~fusiontune.workloads.builtin.make_workload` or the ONNX import.
    """
    if isinstance(source, OnnxSource):
        return load_onnx_workload(source)
    from fusiontune.workloads.builtin import make_workload

    return make_workload(source, **dict(sizes or {}))


def workload_source(space: Any) -> str | OnnxSource:
    """The source of a search space's workload (what a Ray actor is given)."""
    return space.onnx if getattr(space, "onnx", None) is not None else space.workload


def space_workload(space: Any) -> Workload:
    """Build the workload a :class:`~fusiontune.workloads.space.SearchSpace` names, of either kind."""
    return load_workload(workload_source(space), dict(space.sizes))
