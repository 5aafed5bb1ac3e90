"""GradExpanderPass: expand the grad ops whose backward fusion pass is off into primitives."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, GraphEditor
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._grad import OWNERS, application_nodes, expand_off
from fusiontune.passes.pipeline import patterns


@patterns("GradExpand")
def grad_expander(graph: Graph, ctx: PassContext) -> Graph:
    """Replace every grad op whose pass (``_grad.OWNERS``) is off by its expansion (ir/expand.py).

    Identity: each grad op equals its expansion up to rounding (tests/ir/test_grad_ops.py); the
    expansion is the primitive backward the vector-Jacobian rules wrote before the grad ops.

    Preconditions: first in the ``backward`` stage after AutodiffPass, before the backward fusion
    passes: a grad op that an expansion here leaves behind (the SoftmaxGrad of an AttentionGrad)
    meets its own pass afterwards, or is expanded here too when that pass is off.

    Not switchable: without it a switched-off backward pass would leave its op fused.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The graph with those ops expanded (``graph`` itself when there are none).
    """
    todo = [n for n in graph.nodes if n.op in OWNERS and not ctx.config.enabled(OWNERS[n.op])]
    if not todo:
        return graph
    ed = GraphEditor(graph)
    for node in todo:
        if ctx.allow("GradExpand", application_nodes(graph, node)):
            expand_off(ed, node, ctx)
    return ed.finish()
