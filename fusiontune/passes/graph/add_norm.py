"""AddLayerNormFusionPass and AddRmsNormFusionPass: residual add + norm -> one two-output node."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, effective_attrs, op_attrs
from fusiontune.passes.pattern import Builder, Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns

_SUM = P("Add", V("a"), V("b"), name="add")


def varies_by_row(view: View, operand: str, total: str) -> bool:
    """``operand`` broadcasts to ``total`` along its last axis whole and differs from row to row.

    A row is a slice along the normalized (last) axis. An operand of the sum's full shape
    qualifies; one of shape ``(N,)`` or ``(1, ..., 1, N)`` is the same vector for every row (a
    bias, which belongs to the MatMul or the norm's beta), and a scalar is no residual either;
    position embeddings ``(1, S, N)`` against ``(B, S, N)`` differ from row to row.
    """
    shape, full = view.shape(operand), view.shape(total)
    if shape == full:
        return True
    return bool(shape) and shape[-1] == full[-1] and any(d > 1 for d in shape[:-1])


def _build(fused_op: str) -> Builder:
    def build(m: Match) -> Fusion | None:
        view, norm, add = m.view, m.nodes[0], m.node("add")
        a, b, s = m["a"], m["b"], add.outputs[0]
        if all(view.graph.is_constant(v) for v in (a, b)):
            return None
        if not all(varies_by_row(view, v, s) for v in (a, b)):
            return None
        # The fused op has the norm's attributes (eps; LayerNorm's variance mode too).
        attrs = op_attrs(fused_op, **effective_attrs(norm))
        inputs = (a, b, *norm.inputs[1:])
        return Fusion(fused_op, (add, norm), fused_op, inputs, (norm.outputs[0], s), attrs)

    return build


LAYER_NORM_RULES = (
    Rule("AddLayerNorm", P("LayerNorm", _SUM, V("gamma"), V("beta")), _build("AddLayerNorm")),
)
RMS_NORM_RULES = (Rule("AddRmsNorm", P("RMSNorm", _SUM, V("gamma")), _build("AddRmsNorm")),)


@patterns("AddLayerNorm")
def add_layer_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fuse a residual add into the LayerNorm it feeds; the fused node also returns the sum.

    Identity: with ``s = a + b``: ``(LayerNorm(s, gamma, beta, eps), s) ==
    AddLayerNorm(a, b, gamma, beta, eps)``; every other reader of ``s`` reads the second output.

    Preconditions: the sum is the norm's normalized input; neither operand is the same vector for
    every row (a row: a slice along the normalized last axis): each is a residual of the sum's full
    shape, or a term that broadcasts over leading axes only and keeps the last axis whole, such as
    BERT's position embeddings ``(1, S, N)`` against the ``(B, S, N)`` embedding sum; a bias
    ``(N,)`` or ``(1, ..., 1, N)`` or a scalar is not fused (it belongs to the MatMul before or to
    the norm's shift), nor a sum of two constants. When several norms read the sum, one is fused
    (the last in graph order) and the others read the second output.

    Args:
        graph: the graph to rewrite (LayerNormFusionPass runs before this one).
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, LAYER_NORM_RULES)


@patterns("AddRmsNorm")
def add_rms_norm_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fuse a residual add into the RMSNorm it feeds; the fused node also returns the sum.

    Identity: with ``s = a + b``: ``(RMSNorm(s, gamma, eps), s) == AddRmsNorm(a, b, gamma, eps)``;
    every other reader of ``s`` reads the second output. HF's RMSNorm casts its input to float32
    and its result back; in a float32 model those casts are no-ops the canonicalize stage removes,
    so the sum feeds the norm directly (MindSpore's ``add_cast_rms_norm_cast_fusion``).

    Preconditions: the sum is the norm's normalized input; neither operand is the same vector for
    every row (a row: a slice along the normalized last axis): each is a residual of the sum's full
    shape, or a term that broadcasts over leading axes only and keeps the last axis whole, such as
    BERT's position embeddings ``(1, S, N)`` against the ``(B, S, N)`` embedding sum; a bias
    ``(N,)`` or ``(1, ..., 1, N)`` or a scalar is not fused (it belongs to the MatMul before or to
    the norm's shift), nor a sum of two constants. When several norms read the sum, one is fused
    (the last in graph order) and the others read the second output.

    Args:
        graph: the graph to rewrite (RmsNormFusionPass runs before this one).
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RMS_NORM_RULES)
