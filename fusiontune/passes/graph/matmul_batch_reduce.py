"""BatchMatmulReduceFusionPass: a batch of ``X^T @ dY`` summed over the batch is one GEMM."""

from __future__ import annotations

import numpy as np

from fusiontune.ir.graph import Graph
from fusiontune.ir.ops import normalize_axes
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, Ref, Step, effective_attrs
from fusiontune.passes.pattern import Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns


def _build(m: Match) -> Fusion | None:
    red, mm, view = m.nodes[0], m.node("mm"), m.view
    x, g = m["x"], m["g"]
    attrs = effective_attrs(mm)
    if not attrs["trans_a"] or attrs["trans_b"]:
        return None
    xs, gs = view.shape(x), view.shape(g)
    nb = len(xs) - 2
    if nb < 1 or len(gs) != len(xs) or xs[:-1] != gs[:-1]:
        return None  # same batch and rows on both sides: no broadcasting
    r = effective_attrs(red)
    if r.get("keepdims", True) or normalize_axes(r.get("axes"), len(xs)) != tuple(range(nb)):
        return None
    rows = int(np.prod(xs[:-1]))
    before = (Step("Reshape", (x,), {"shape": (rows, xs[-1])}), Step("Reshape", (g,), {"shape": (rows, gs[-1])}))
    return Fusion("BatchMatMulReduceSum", m.nodes, "MatMul", (Ref(0), Ref(1)), red.outputs, {"trans_a": 1}, before)


RULES = (Rule("BatchMatMulReduceSum", P("ReduceSum", P("MatMul", V("x"), V("g"), name="mm")), _build),)


@patterns("BatchMatMulReduceSum")
def batch_matmul_reduce_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Sum a batch of ``X_b^T @ dY_b`` as one GEMM over the stacked rows.

    Identity: ``sum_b X_b^T dY_b == X^T dY`` with ``X = Reshape(x, (B*S, D))`` and
    ``dY = Reshape(dy, (B*S, F))``: the batch sum is the contraction over the rows of all the
    batches. A weight's gradient (``sum_to`` of ``MatMul(x, dy, trans_a=1)`` over the batch axes,
    as the backward writes it after TransposeMatMulFusionPass) becomes one GEMM with K = B*S and
    no (B, D, F) partial products, and its optimizer update can be the GEMM's epilogue.
    The sums are associated differently (rounding only).

    Preconditions: ``trans_a=1``, ``trans_b=0``, both operands of one batch shape and one row
    count (no broadcasting), the ReduceSum sums exactly the batch axes (``keepdims=0``) and is the
    MatMul's only reader. The Reshapes are views (ReshapeRemovePass), not copies.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
