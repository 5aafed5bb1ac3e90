"""TbeMatmulElemwiseFusionPass: a MatMul kernel runs the elementwise kernel that reads its product."""

from __future__ import annotations

from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit


@patterns("MatMulElemwise")
def matmul_elemwise_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Merge an elementwise loop kernel into the MatMul kernel whose product it reads.

    The single-op epilogue passes (``matmul_elem_*``) take one BiasAdd, Relu, Gelu or residual
    Add; this one, after basic and composite fusion, takes a whole elementwise kernel over the
    product's shape: a backward's ``dX = dY W^T`` followed by its elementwise chain, or a weight
    gradient ``X^T dY`` followed by the optimizer's update (SGD's momentum and step), which then
    runs on each block of the gradient while it is in cache; the gradient itself stays an output
    when the step returns it.

    Only *basic* elementwise kernels (arithmetic, comparisons, Where, Cast: SGD's update, not
    Adam's Sqrt nor GeluGrad's Exp): the epilogue loop runs per row block after the GEMM and
    vectorizes worse than a loop nest, so a transcendental is faster in a kernel of its own
    (Adam's update in the epilogue made the transformer_block step 4% slower, SGD's 3% faster).

    Identity: as for every epilogue, ``f(A @ B)`` per element right after BLAS writes the product
    equals the two kernels with the product stored, exactly. Preconditions: the loop kernel is
    basic elementwise only (no reduction), every array it reads broadcasts to the product's shape
    and every output has that shape (the contraction template checks), it reads the product, and
    the group DAG stays acyclic.
    """
    part = Partition(fused)
    graph = fused.graph
    for gid in part.group_ids():
        if gid not in part.members or part.kind(gid) != "contraction":
            continue
        mm = next(graph.node(n) for n in part.members[gid] if graph.node(n).op == "MatMul")
        for succ in sorted(part.successors(gid)):
            if succ not in part.members or part.kind(succ) != "loop":
                continue
            if not part.is_basic_eltwise(succ):
                continue
            reads = {i for n in part.members[succ] for i in graph.node(n).inputs}
            if not reads & set(graph.node(n).outputs[0] for n in part.members[gid]) and mm.outputs[0] not in reads:
                continue
            if part.try_merge(gid, succ) is not None:
                break
    return commit(part, ctx, "TbeMatmulElemwiseFusionPass", lambda p, g: "MatMulElemwise")
