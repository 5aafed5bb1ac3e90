"""MatMulBiasAddFusionPass: fold a bias add into the MatMul that feeds it."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, Shape
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion
from fusiontune.passes.pattern import Builder, Match, P, Rule, V, apply_rules, constant
from fusiontune.passes.pipeline import patterns

_MATMUL = P("MatMul", V("a"), V("b"), name="mm")  # two inputs: no bias yet


def _bias_shape(shape: Shape, n: int, rank: int) -> bool:
    """(N,) or (1, ..., 1, N), no longer than the MatMul output's rank."""
    return 1 <= len(shape) <= rank and shape[-1] == n and all(d == 1 for d in shape[:-1])


def _build(pattern: str) -> Builder:
    def build(m: Match) -> Fusion | None:
        mm, bias = m.node("mm"), m["bias"]
        shape = m.view.shape(mm.outputs[0])
        if pattern == "MatMulAdd" and not _bias_shape(m.view.shape(bias), shape[-1], len(shape)):
            return None
        root = m.nodes[0]
        return Fusion(pattern, m.nodes, "MatMul", (m["a"], m["b"], bias), root.outputs)

    return build


RULES = (
    Rule("MatMulBiasAdd", P("BiasAdd", _MATMUL, V("bias")), _build("MatMulBiasAdd")),
    Rule("MatMulAdd", P("Add", _MATMUL, V("bias", where=constant)), _build("MatMulAdd")),
)


@patterns("MatMulBiasAdd", "MatMulAdd")
def matmul_bias_add_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Give a MatMul the bias that the next node adds.

    Identity: ``BiasAdd(MatMul(a, b), bias) == MatMul(a, b, bias)`` and
    ``MatMul(a, b) + c == c + MatMul(a, b) == MatMul(a, b, c)``.

    Preconditions: the MatMul has no bias yet and its output has no reader but the add (and is no
    graph output); for ``Add`` the other operand is a constant of shape ``(N,)`` or
    ``(1, ..., 1, N)``, N the last dimension, so it broadcasts without changing the output shape;
    the result dtype is the MatMul's.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
