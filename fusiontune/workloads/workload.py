"""Workload records: a graph with its inputs and float64 reference outputs, and the spec that makes one.

A :class:`Workload` is what every evaluator loads once and then measures many configurations
against: the graph the passes rewrite, the inputs every program runs on, and the outputs of the
float64 interpreter on the *unfused* graph, which every accuracy metric compares with.

A training workload (:func:`training_workload`) holds the forward graph with its weights made
inputs, and a :class:`~fusiontune.ir.training.TrainSpec`: the pipeline makes the step of the fused
forward (``run_pipeline(..., train=workload.train)``), and the reference is the step of the unfused
one: the loss, every gradient and every updated weight and optimizer state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from fusiontune.errors import UserError
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.ir.training import (
    TrainSpec,
    compared_as_one,
    parameters,
    promote_parameters,
    step_inputs,
    training_step,
)
from fusiontune.measure.accuracy import ErrorMetrics, compare
from fusiontune.workloads._memory import check_fits, workload_bytes

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
        train: for a training step, how ``graph`` (the forward) becomes the step; None: inference.
    """

    name: str
    graph: Graph
    inputs: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    params: Mapping[str, int]
    train: TrainSpec | None = None

    def __post_init__(self) -> None:
        for key in ("inputs", "reference", "params"):
            object.__setattr__(self, key, MappingProxyType(dict(getattr(self, key))))

    def errors(self, outputs: Mapping[str, np.ndarray]) -> ErrorMetrics:
        """``outputs`` against the reference; a training step's gradients, weights and states
        each as one vector (:func:`fusiontune.ir.training.compared_as_one`).

        Raises:
            KeyError: an output is missing.
            ValueError: an output has the wrong shape.
        """
        if self.train is None:
            return compare(outputs, self.reference)
        return compare(compared_as_one(outputs, self.reference), compared_as_one(self.reference, self.reference))

    @property
    def reference_graph(self) -> Graph:
        """The unfused graph the reference runs: ``graph``, or the training step of it."""
        return self.graph if self.train is None else training_step(self.graph, self.train)


def build_workload(spec: WorkloadSpec, sizes: Mapping[str, int], train: TrainSpec | None = None) -> Workload:
    """Build the graph of ``spec`` with ``sizes``, make its inputs and run the float64 reference.

    Args:
        spec: the table row.
        sizes: complete, already checked size parameters.
        train: make the model's training step instead (see :func:`finish_workload`).

    Returns:
        The workload.
    """
    graph = spec.build(**sizes)
    return finish_workload(spec.name, graph, spec.inputs.make(graph), sizes, train)


def finish_workload(
    name: str,
    graph: Graph,
    inputs: Mapping[str, np.ndarray],
    params: Mapping[str, int],
    train: TrainSpec | None = None,
) -> Workload:
    """The workload of ``graph`` on ``inputs``: its float64 reference run, or, with ``train``, its
    training step (:func:`training_workload`), whose reference is the step's alone (the forward's
    own reference is never run).

    Raises:
        UserError: a training step that does not fit the model (no weights, no such output...),
            or whose reference cannot fit in memory.
    """
    if train is None:
        return Workload(name, graph, inputs, run_graph(graph, inputs, "float64"), dict(params))
    try:
        return training_workload(Workload(name, graph, inputs, {}, dict(params)), train)
    except (ValueError, NotImplementedError) as e:
        raise UserError(f"{name}: cannot train: {e}") from None


def training_workload(workload: Workload, spec: TrainSpec, seed: int = 0) -> Workload:
    """The training step of ``workload``'s model, with ``spec``'s loss and optimizer (its
    reference outputs are not used: the step has its own).

    The weights (:func:`fusiontune.ir.training.parameters`, unless ``spec.params`` names them)
    become inputs bound to their values; the loss's target or labels and the optimizer state are
    drawn with ``seed``. The reference is the float64 step of the unfused forward.

    Raises:
        ValueError: the model has no weights, or ``spec`` does not fit it (no such output...).
        UserError: the step's float64 reference (every value of forward and backward at once)
            needs more memory than the machine has available.
    """
    if workload.train is not None:
        return workload
    params = spec.params or parameters(workload.graph)
    if not params:
        raise ValueError(f"{workload.name}: the model has no weights to train")
    forward, values = promote_parameters(workload.graph, params)
    spec = replace(spec, params=params)
    step = training_step(forward, spec)
    check_fits(
        workload_bytes(step),
        f"the training step of {workload.name}",
        "inputs, weights, optimizer state and the float64 reference of forward and backward",
    )
    inputs = {**workload.inputs, **values, **step_inputs(forward, spec, seed)}
    reference = run_graph(step, inputs, "float64")
    return Workload(workload.name, forward, inputs, reference, workload.params, spec)
