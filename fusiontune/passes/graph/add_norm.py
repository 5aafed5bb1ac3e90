"""AddLayerNormFusionPass and AddRmsNormFusionPass: residual add + norm -> one two-output node."""

from __future__ import annotations

from collections.abc import Iterator

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Finder, Fusion, View, effective_attrs, op_attrs, rewrite
from fusiontune.passes.pipeline import patterns


def _finder(norm_op: str, fused_op: str) -> Finder:
    def find(view: View, add: Node) -> Iterator[Fusion]:
        if add.op != "Add":
            return
        a, b = add.inputs
        s = add.outputs[0]
        if any(view.graph.is_constant(v) or view.shape(v) != view.shape(s) for v in (a, b)):
            return
        for norm in view.readers(s):
            if norm.op == norm_op and norm.inputs[0] == s:
                # The fused op has the norm's attributes (eps; LayerNorm's variance mode too).
                attrs = op_attrs(fused_op, **effective_attrs(norm))
                inputs = (a, b, *norm.inputs[1:])
                yield Fusion(fused_op, (add, norm), fused_op, inputs, (norm.outputs[0], s), attrs)

    return find


_find_layer_norm = _finder("LayerNorm", "AddLayerNorm")
_find_rms_norm = _finder("RMSNorm", "AddRmsNorm")


@patterns("AddLayerNorm")
def add_layer_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fuse a residual add into the LayerNorm it feeds; the fused node also returns the sum.

    Identity: with ``s = a + b``: ``(LayerNorm(s, gamma, beta, eps), s) ==
    AddLayerNorm(a, b, gamma, beta, eps)``; every other reader of ``s`` reads the second output.

    Preconditions: neither operand is a constant, and both have the sum's full shape (a
    residual add, no broadcasting); the sum is the LayerNorm's normalized input (the first
    LayerNorm reading it is fused; one that reads it later reads the second output).

    Args:
        graph: the graph to rewrite (LayerNormFusionPass runs before this one).
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find_layer_norm)


@patterns("AddRmsNorm")
def add_rms_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fuse a residual add into the RMSNorm it feeds; the fused node also returns the sum.

    Identity: with ``s = a + b``: ``(RMSNorm(s, gamma, eps), s) == AddRmsNorm(a, b, gamma, eps)``;
    every other reader of ``s`` reads the second output.

    Preconditions: neither operand is a constant, and both have the sum's full shape (a
    residual add, no broadcasting); the sum is the RMSNorm's normalized input.

    Args:
        graph: the graph to rewrite (RmsNormFusionPass runs before this one).
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return rewrite(graph, ctx, _find_rms_norm)
