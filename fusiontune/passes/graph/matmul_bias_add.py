"""MatMulBiasAddFusionPass: fold a bias add into the MatMul that feeds it."""

from __future__ import annotations

from collections.abc import Iterator

from fusiontune.ir.graph import Graph, Node, Shape
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, rewrite
from fusiontune.passes.pipeline import patterns


def _bias_shape(shape: Shape, n: int, rank: int) -> bool:
    """(N,) or (1, ..., 1, N), no longer than the MatMul output's rank."""
    return 1 <= len(shape) <= rank and shape[-1] == n and all(d == 1 for d in shape[:-1])


def _find(view: View, mm: Node) -> Iterator[Fusion]:
    if mm.op != "MatMul" or len(mm.inputs) != 2:
        return
    y = mm.outputs[0]
    user = view.sole_reader(y, "BiasAdd", "Add")
    if user is None:
        return
    if user.op == "BiasAdd":
        if user.inputs[0] == y:
            yield Fusion(
                "MatMulBiasAdd", (mm, user), "MatMul", (*mm.inputs, user.inputs[1]), user.outputs
            )
        return
    shape = view.shape(y)
    for a, c in View.orders(user):
        if (
            a == y
            and view.graph.is_constant(c)
            and _bias_shape(view.shape(c), shape[-1], len(shape))
        ):
            yield Fusion("MatMulAdd", (mm, user), "MatMul", (*mm.inputs, c), user.outputs)


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
    return rewrite(graph, ctx, _find)
