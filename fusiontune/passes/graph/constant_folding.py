"""ConstantFoldingPass: evaluate nodes whose inputs are all constants."""

from __future__ import annotations

import numpy as np

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.ir.ops import run_reference
from fusiontune.passes.base import PassContext
from fusiontune.passes.pipeline import patterns

# A fold that broadcasts a small constant into a big one trades a cheap kernel for a big constant
# in every program (and in every structural hash), so growth past this size is left to run.
GROWTH_LIMIT = 1 << 16


def _worth_folding(graph: Graph, node: Node) -> bool:
    biggest_in = max(graph.values[i].size for i in node.inputs)
    biggest_out = max(graph.values[o].size for o in node.outputs)
    return biggest_out <= max(biggest_in, GROWTH_LIMIT)


def _widen(arr: np.ndarray) -> np.ndarray:
    return arr.astype(np.float64) if np.issubdtype(arr.dtype, np.floating) else arr


@patterns("ConstantFolding")
def constant_folding(graph: Graph, ctx: PassContext) -> Graph:
    """Replace every node whose inputs are all constants by constants holding its outputs.

    Identity: ``op(c1, ..., ck) == run_reference(op, c1, ..., ck)``, folded in node order so that
    chains of constant nodes fold completely. Each fold computes in float64 and rounds once to the
    declared dtype, so a folded value is the closest one to the float64 reference.

    Preconditions: the node has at least one input and all its inputs are constants (initializers
    or earlier folds); its largest output is no larger than its largest input or
    ``GROWTH_LIMIT`` elements (a broadcast that would inflate a constant is left to run).

    Args:
        graph: the graph to fold.
        ctx: the pass context; one application per folded node.

    Returns:
        The folded graph (``graph`` itself when nothing folds).
    """
    editor = GraphEditor(graph)
    consts: dict[str, np.ndarray] = dict(graph.constants)
    changed = False
    for node in graph.nodes:
        if not node.inputs or not all(i in consts for i in node.inputs):
            continue
        if not _worth_folding(graph, node) or not ctx.allow("ConstantFolding", node.origin):
            continue
        results = run_reference(node, [_widen(consts[i]) for i in node.inputs])
        for out, arr in zip(node.outputs, results, strict=True):
            folded = np.array(arr, dtype=graph.values[out].dtype)
            consts[out] = folded
            editor.constants[out] = folded
        editor.remove_nodes([node.name])
        changed = True
    return editor.finish() if changed else graph
