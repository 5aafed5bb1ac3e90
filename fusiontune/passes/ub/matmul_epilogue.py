"""MatMul epilogue fusion: the MatMul kernel applies a following op to each result while in cache.

Four passes share this module, one per epilogue, named as MindSpore names them
(matmul_elem_biasadd_fusion, matmul_elem_relu_fusion, matmul_elem_gelu_fusion,
matmul_elem_add_fusion), so each can be switched on its own.
"""

from __future__ import annotations

from collections.abc import Callable

from fusiontune.ir.graph import Graph, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns
from fusiontune.passes.ub._grouping import Partition, commit

Matcher = Callable[[Graph, Node, str], bool]


def _is_bias(graph: Graph, node: Node, acc: str) -> bool:
    if node.op == "BiasAdd":
        return node.inputs[0] == acc
    if node.op != "Add":
        return False
    other = node.inputs[1] if node.inputs[0] == acc else node.inputs[0]
    shape, n = graph.values[other].shape, graph.values[acc].shape[-1]
    return all(d == 1 for d in shape[:-1]) and len(shape) >= 1 and shape[-1] == n


def _is_residual(graph: Graph, node: Node, acc: str) -> bool:
    if node.op != "Add":
        return False
    other = node.inputs[1] if node.inputs[0] == acc else node.inputs[0]
    return graph.values[other].shape == graph.values[acc].shape and not graph.is_constant(other)


def _epilogue(fused: FusedGraph, ctx: PassContext, pass_name: str, pattern: str, match: Matcher) -> FusedGraph:
    part = Partition(fused)
    graph = fused.graph
    for gid in part.group_ids():
        if gid not in part.members or part.kind(gid) != "contraction":
            continue
        # The group's single exported value and its single reader.
        outs = [o for n in part.members[gid] for o in graph.node(n).outputs
                if any(part.owner[r] != gid for r in part.readers(o)) or o in graph.outputs]
        if len(outs) != 1 or outs[0] in graph.outputs:
            continue
        readers = part.readers(outs[0])
        if len(readers) != 1:
            continue
        node = graph.node(readers[0])
        target = part.owner[node.name]
        if len(part.members[target]) == 1 and match(graph, node, outs[0]):
            part.try_merge(gid, target)
    return commit(part, ctx, pass_name, lambda p, g: pattern)


def _make(pass_name: str, pattern: str, match: Matcher, doc: str) -> Callable[[FusedGraph, PassContext], FusedGraph]:
    @patterns(pattern)
    def run(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
        return _epilogue(fused, ctx, pass_name, pattern, match)

    run.__doc__ = doc
    run.__name__ = pass_name
    return run


_COMMON = (
    " Identity: ``epilogue(A @ B)`` computed on each result element right after BLAS writes it"
    " equals the two kernels with the product stored, exactly. Preconditions: the MatMul's result"
    " has exactly one reader, that reader is the op named, and it is not yet in another kernel."
)

matmul_elem_biasadd_fusion = _make(
    "MatmulElemBiasaddFusionPass", "MatMulBiasAdd",
    lambda g, n, acc: _is_bias(g, n, acc),
    "MatMul followed by BiasAdd (or Add of a vector over the last axis) becomes one kernel." + _COMMON,
)
matmul_elem_relu_fusion = _make(
    "MatmulElemReluFusionPass", "MatMulRelu",
    lambda g, n, acc: n.op == "Relu",
    "MatMul followed by Relu becomes one kernel." + _COMMON,
)
matmul_elem_gelu_fusion = _make(
    "MatmulElemGeluFusionPass", "MatMulGelu",
    lambda g, n, acc: n.op == "Gelu",
    "MatMul followed by Gelu (either form) becomes one kernel." + _COMMON,
)
matmul_elem_add_fusion = _make(
    "MatmulElemAddFusionPass", "MatMulAdd",
    _is_residual,
    "MatMul followed by an Add of a same-shape tensor (a residual) becomes one kernel." + _COMMON,
)
