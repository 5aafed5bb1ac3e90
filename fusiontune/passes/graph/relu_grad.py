"""ReluGradFusionPass: Relu's backward from its output, one ReluGrad op (seed 004's FusedAddReLU)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._grad import keep_or_expand, producer
from fusiontune.passes.pipeline import patterns


def _pattern(graph: Graph, node: Node) -> str:
    relu = producer(graph, node.inputs[0])
    pre = producer(graph, relu.inputs[0]) if relu is not None and relu.op == "Relu" else None
    return "AddReluGrad" if pre is not None and pre.op in ("Add", "BiasAdd") else "ReluGrad"


@patterns("ReluGrad", "AddReluGrad")
def relu_grad_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Keep each ReluGrad node of a training step's backward as one op.

    Identity: with ``y = Relu(x)``, ``y > 0`` exactly where ``x > 0`` (NaN: both false), so
    ``ReluGrad(y, dy) == Where(Greater(y, 0), dy, 0)``, Relu's subgradient (0 at 0). It reads the
    forward *output*: the pre-activation of a ``Relu(a + b)`` (pattern ``AddReluGrad``, seed 004's
    FusedAddReLU, whose backward hands the same gradient to ``a`` and ``b``) need not be kept for
    the backward. Kept, the op is one scalar rule inside a basic elementwise kernel; denied (or with
    the switch off), it is spliced in as the Greater / Where primitives, which basic fusion groups
    the same way: this switch changes which value the backward reads, rarely the kernel count.

    Preconditions: runs in the ``backward`` stage after AutodiffPass; the node reads the Relu's
    output and the cotangent.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The graph, denied applications expanded (``graph`` itself when it has no ReluGrad).
    """
    return keep_or_expand(graph, ctx, "ReluGrad", _pattern)
