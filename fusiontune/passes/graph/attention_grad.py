"""AttentionGradFusionPass: Attention's backward as one AttentionGrad kernel (flash-attention backward)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._grad import keep_or_expand
from fusiontune.passes.pipeline import patterns


@patterns("AttentionGrad")
def attention_grad_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Keep each AttentionGrad node of a training step's backward as one kernel.

    Identity: with ``p = softmax(q k^T * scale + mask)`` and ``dp = dy v^T``,
    ``AttentionGrad(q, k, v, dy) == (scale * ds k, scale * ds^T q, p^T dy)``,
    ``ds = p * (dp - rowsum(dp * p)) = SoftmaxGrad(p, dp)``: the primitive backward of Attention
    (its expansion, ir/expand.py: MatMuls and Transposes around a Softmax and a SoftmaxGrad).
    Kept, one kernel per step runs every (batch, head) with the scores and dp in cache
    (codegen/attention_grad.py): the recomputed scores, the probabilities and ``ds`` never go
    through memory, and the five MatMul kernels, the softmax kernel and the transposes between
    them are one kernel. Denied (or with the switch off, through GradExpanderPass), the node is
    spliced in as its primitive form, whose SoftmaxGrad SoftmaxGradFusionPass then meets.

    Preconditions: runs in the ``backward`` stage after AutodiffPass and before
    SoftmaxGradFusionPass; Attention's rule writes the op only where q, k, v and the cotangent
    share their batch axes and the mask (if any) needs no gradient.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The graph, denied applications expanded (``graph`` itself when it has no AttentionGrad).
    """
    return keep_or_expand(graph, ctx, "AttentionGrad", lambda g, n: "AttentionGrad")
