"""AutodiffPass: a training step's loss, backward and optimizer update, after GraphFusion."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.ir.training import training_step
from fusiontune.passes.base import PassContext
from fusiontune.passes.pipeline import patterns


@patterns("TrainingStep")
def autodiff(graph: Graph, ctx: PassContext) -> Graph:
    """Write the training step of the fused forward ``graph`` (``ctx.train``).

    The backward is made by the vector-Jacobian rules of the ops the forward holds after
    GraphFusion: a Softmax, LayerNorm or Attention node that a pass formed gets its own op's rule,
    a decomposed one the rules of its primitives. Identity: the step of a graph is the step of any
    graph that computes the same function, up to rounding (the rules are checked against finite
    differences in tests/ir/test_autodiff.py).

    Preconditions: ``ctx.train`` names parameters that are graph inputs, and an output the loss
    can read (a float output; for cross-entropy, classes on its last axis).

    Not switchable: the pipeline runs it exactly when it builds a training step.
    """
    if ctx.train is None:  # an inference graph (the pipeline skips this stage for those)
        return graph
    if not ctx.allow("TrainingStep", (graph.name,)):
        return graph
    return training_step(graph, ctx.train)
