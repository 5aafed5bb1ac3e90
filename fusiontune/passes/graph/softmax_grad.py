"""SoftmaxGradFusionPass: Softmax's backward as one SoftmaxGrad kernel (MindSpore ``SoftmaxGrad``)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._grad import keep_or_expand
from fusiontune.passes.pipeline import patterns


def _pattern(graph: Graph, node: Node) -> str:
    # The rules write under the scope grad/<forward node>/ (ir/autodiff.py).
    attention = any(n.op == "Attention" and node.name.startswith(f"grad/{n.name}/") for n in graph.nodes)
    return "AttentionSoftmaxGrad" if attention else "SoftmaxGrad"


@patterns("SoftmaxGrad", "AttentionSoftmaxGrad")
def softmax_grad_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Keep each SoftmaxGrad node of a training step's backward as one op (one kernel).

    Identity: with ``y = Softmax(x, a)``,
    ``SoftmaxGrad(y, dy) == y * (dy - ReduceSum(dy * y, a))``, the primitive backward (Softmax's
    rule and the softmax inside Attention's rule write the op; its expansion, ir/expand.py, is
    that primitive form). The forward output ``y`` is the saved statistic: nothing of the forward
    is recomputed. Kept, the op is one loop nest with two rounds over each row (the sum, then the
    scale); denied (or with the switch off, through GradExpanderPass), it is spliced in as the
    ReduceSum / Mul / Sub primitives the UBFusion passes group. Pattern ``AttentionSoftmaxGrad``
    is the one inside an Attention node's backward.

    Preconditions: runs in the ``backward`` stage after AutodiffPass (a training step); the node
    reads the softmax output and the cotangent, of one shape.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The graph, denied applications expanded (``graph`` itself when it has no SoftmaxGrad).
    """
    return keep_or_expand(graph, ctx, "SoftmaxGrad", _pattern)
