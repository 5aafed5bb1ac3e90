"""Workload records: a graph with its inputs and float64 reference outputs, and the spec that makes one.

A :class:`Workload` is what every evaluator loads once and then measures many configurations
against: the graph the passes rewrite, the inputs every program runs on, and the outputs of the
float64 interpreter on the *unfused* graph, which every accuracy metric compares with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph

GraphMaker = Callable[..., Graph]
"""A workload builder: keyword size parameters -> the graph (weights are built in, deterministic)."""


@dataclass(frozen=True)
class InputSpec:
    """How a workload's inputs are made.

    Attributes:
        fill: inputs set to one value everywhere, by input name (the seeds' ``np.ones(...) * 0.5``).
        seed: seed of the standard-normal draw for every input not in ``fill``
            (:func:`fusiontune.ir.interpreter.random_inputs`).
    """

    fill: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fill", MappingProxyType(dict(self.fill)))

    def make(self, graph: Graph) -> dict[str, np.ndarray]:
        """Arrays for every input of ``graph``, in its own dtypes.

        Args:
            graph: the workload graph.

        Returns:
            One array per graph input, by name.
        """
        arrays = random_inputs(graph, self.seed)
        for name, value in self.fill.items():
            v = graph.values[name]
            arrays[name] = np.full(v.shape, value, dtype=v.dtype)
        return arrays

    def describe(self) -> str:
        """One line, e.g. ``x = 0.2, y = 0.3`` or ``standard normal, seed 0``."""
        if not self.fill:
            return f"standard normal, seed {self.seed}"
        return ", ".join(f"{k} = {v:g}" for k, v in self.fill.items())


@dataclass(frozen=True)
class WorkloadSpec:
    """One row of the built-in workload table.

    Attributes:
        name: the workload name users type (``fusiontune run --workload NAME``).
        build: the graph builder; takes exactly the keys of ``sizes`` as keyword arguments.
        sizes: default size parameters.
        description: one line for listings.
        inputs: how the inputs are made.
    """

    name: str
    build: GraphMaker
    sizes: Mapping[str, int]
    description: str
    inputs: InputSpec = InputSpec()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))


@dataclass(frozen=True, eq=False)
class Workload:
    """A graph ready to be measured.

    Attributes:
        name: the workload name.
        graph: the unfused graph.
        inputs: one array per graph input, in the graph's dtypes.
        reference: the float64 outputs of the interpreter on ``graph`` and ``inputs``.
        params: the size parameters the graph was built with.
    """

    name: str
    graph: Graph
    inputs: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    params: Mapping[str, int]

    def __post_init__(self) -> None:
        for key in ("inputs", "reference", "params"):
            object.__setattr__(self, key, MappingProxyType(dict(getattr(self, key))))


def build_workload(spec: WorkloadSpec, sizes: Mapping[str, int]) -> Workload:
    """Build the graph of ``spec`` with ``sizes``, make its inputs and run the float64 reference.

    Args:
        spec: the table row.
        sizes: complete, already checked size parameters.

    Returns:
        The workload.
    """
    graph = spec.build(**sizes)
    inputs = spec.inputs.make(graph)
    reference = run_graph(graph, inputs, "float64")
    return Workload(spec.name, graph, inputs, reference, dict(sizes))
