"""The interpreter: runs any graph node by node with the numpy references.

``run_graph(g, inputs, dtype="float64")`` is the accuracy reference of every measurement: inputs,
constants and float casts are promoted to float64, so it computes the ideal math of the unfused
graph. ``dtype=None`` runs the graph in its own dtypes (the float32 unfused baseline whose error
no fused configuration can be expected to beat).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fusiontune.ir.graph import Graph, Node
from fusiontune.ir.ops import run_reference


def _promote(arr: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or not np.issubdtype(arr.dtype, np.floating):
        return arr
    return arr.astype(dtype, copy=False)


def run_graph(
    graph: Graph, inputs: Mapping[str, np.ndarray], dtype: str | None = "float64"
) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` and return its outputs by name.

    Args:
        graph: the graph to run.
        inputs: one array per graph input.
        dtype: float dtype to compute in (every float tensor and every float Cast is promoted), or
            None to keep the graph's own dtypes.

    Returns:
        The graph outputs, by value name.

    Raises:
        KeyError: an input is missing.
    """
    env: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise KeyError(f"{graph.name}: missing input {name!r}")
        env[name] = _promote(np.asarray(inputs[name]), dtype)
    for name, arr in graph.constants.items():
        env[name] = _promote(arr, dtype)
    for node in graph.nodes:
        _run_node(node, env, dtype)
    return {name: env[name] for name in graph.outputs}


def _run_node(node: Node, env: dict[str, np.ndarray], dtype: str | None) -> None:
    # In the float64 reference a cast between float types is the identity: the reference is the
    # ideal math of the graph, and rounding to a narrower float is exactly what it measures. A
    # cast of a bool or integer tensor to a float converts it (to the float64 of the reference).
    if dtype is not None and node.op == "Cast" and np.issubdtype(np.dtype(node.attr("to", "float32")), np.floating):
        outs: tuple[np.ndarray, ...] = (env[node.inputs[0]].astype(dtype, copy=False),)
    else:
        outs = run_reference(node, [env[i] for i in node.inputs])
    for name, arr in zip(node.outputs, outs, strict=True):
        env[name] = _promote(arr, dtype)


def run_all_values(graph: Graph, inputs: Mapping[str, np.ndarray], dtype: str | None = "float64") -> dict[str, np.ndarray]:
    """Like :func:`run_graph` but returns every value (for debugging a kernel against the reference)."""
    env: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise KeyError(f"{graph.name}: missing input {name!r}")
        env[name] = _promote(np.asarray(inputs[name]), dtype)
    env.update({k: _promote(v, dtype) for k, v in graph.constants.items()})
    for node in graph.nodes:
        _run_node(node, env, dtype)
    return env


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic standard-normal inputs (bools: fair coins) for every graph input."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        v = graph.values[name]
        if v.dtype == "bool":
            out[name] = rng.random(v.shape) < 0.5
        elif np.issubdtype(np.dtype(v.dtype), np.integer):
            out[name] = rng.integers(0, 8, size=v.shape).astype(v.dtype)
        else:
            out[name] = rng.standard_normal(v.shape).astype(v.dtype)
    return out
