"""TransposeMatMulFusionPass: a MatMul reads a Transpose of its operand's last two axes itself."""

from __future__ import annotations

from fusiontune.ir.graph import Graph
from fusiontune.ir.ops import get_op
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, effective_attrs
from fusiontune.passes.pattern import Builder, Match, P, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns


def _swaps_last_two(view: View, value: str) -> bool:
    """``value`` is written by a Transpose that swaps the last two axes and keeps the others."""
    node = view.producer(value, "Transpose")
    if node is None:
        return False
    rank = len(view.shape(node.inputs[0]))
    perm = tuple(effective_attrs(node).get("perm") or reversed(range(rank)))
    return rank >= 2 and perm == (*range(rank - 2), rank - 1, rank - 2)


def _t(stem: str) -> P:
    return P("Transpose", V(stem), name=f"{stem}_t")


def _build(pattern: str, fold_a: bool, fold_b: bool) -> Builder:
    def build(m: Match) -> Fusion | None:
        mm = m.node("mm")
        a = m.node("a_t").inputs[0] if fold_a else m["a"]
        b = m.node("b_t").inputs[0] if fold_b else m["b"]
        if fold_a and not _swaps_last_two(m.view, mm.inputs[0]):
            return None
        if fold_b and not _swaps_last_two(m.view, mm.inputs[1]):
            return None
        attrs = {**get_op("MatMul").attrs, **mm.attrs}
        new = {
            "trans_a": int(bool(attrs["trans_a"]) != fold_a),
            "trans_b": int(bool(attrs["trans_b"]) != fold_b),
        }
        extra = {k: v for k, v in mm.attrs.items() if k not in new}
        bias = tuple(mm.inputs[2:])
        return Fusion(pattern, m.nodes, "MatMul", (a, b, *bias), mm.outputs,
                      {**extra, **{k: v for k, v in new.items() if v}})

    return build


def _rules() -> tuple[Rule, ...]:
    rules: list[Rule] = []
    for fold_a, fold_b, name in ((True, True, "TransposeMatMulTranspose"), (True, False, "TransposeMatMul"),
                                 (False, True, "MatMulTranspose")):
        a = _t("a") if fold_a else V("a")
        b = _t("b") if fold_b else V("b")
        rules.append(Rule(name, P("MatMul", a, b, name="mm"), _build(name, fold_a, fold_b)))
        rules.append(Rule(name, P("MatMul", a, b, V("bias"), name="mm"), _build(name, fold_a, fold_b)))
    return tuple(rules)


RULES = _rules()


@patterns("TransposeMatMulTranspose", "TransposeMatMul", "MatMulTranspose")
def transpose_matmul_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Let a MatMul read a transposed operand in place of a Transpose kernel.

    Identity: ``MatMul(Transpose(a, swap), b) == MatMul(a, b, trans_a=1)`` and likewise for ``b``
    (``trans_b``), where ``swap`` exchanges the last two axes and keeps the others; a flag already
    set is toggled (``Transpose(Transpose(a)) == a``). Exact: BLAS multiplies the same numbers,
    it only reads the stored operand with a transpose flag, so the layout kernel that copied it
    is gone.

    It runs after the backward stage (the first row of ``split_pre``), where the backward's
    ``dX = dY @ W^T`` and ``dW = X^T @ dY`` have their Transposes, and after every GraphFusion
    pattern over MatMul (``MatMul(q, Transpose(k))`` of FlashAttentionFusionPass) has been tried.

    Preconditions: the Transpose swaps exactly the last two axes, and its output has no reader
    but this MatMul (and is no graph output).

    Args:
        graph: the graph to rewrite.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    return apply_rules(graph, ctx, RULES)
