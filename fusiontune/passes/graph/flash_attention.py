"""FlashAttentionFusionPass: MatMul(q, k^T) [* scale] [+ mask] -> Softmax -> MatMul(., v) -> Attention."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Fusion, View, effective_attrs, op_attrs, rewrite
from fusiontune.passes.pipeline import patterns


@dataclass(frozen=True, eq=False)
class _AttentionFusion(Fusion):
    """A Fusion whose k operand may need a Transpose to the (..., Sk, D) layout.

    ``inputs[1]`` is a shape probe (an empty broadcast array) so that the shared validity check
    types the Attention node; :meth:`apply` writes the real k: ``k_source`` itself when
    ``k_perm`` is None, else a new ``Transpose(k_source, k_perm)`` node.
    """

    k_source: str = ""
    k_perm: tuple[int, ...] | None = None
    k_origin: tuple[str, ...] = ()

    def apply(self, editor: GraphEditor, origin: tuple[str, ...]) -> None:
        k = self.k_source
        if self.k_perm is not None:
            probe = self.inputs[1]
            assert isinstance(probe, np.ndarray)
            k = editor.add_value(editor.fresh("attention_k"), tuple(probe.shape), str(probe.dtype))
            t = editor.fresh("Transpose")
            editor.add_node(Node(t, "Transpose", (self.k_source,), (k,), {"perm": self.k_perm}, self.k_origin))
        ins = tuple(k if i == 1 else x for i, x in enumerate(self.inputs))
        assert all(isinstance(x, str) for x in ins)
        name = editor.fresh(self.op)
        editor.remove_nodes(self.names)
        editor.add_node(Node(name, self.op, ins, self.outputs, dict(self.attrs), origin))  # type: ignore[arg-type]


def _swap_last(perm: tuple[int, ...]) -> tuple[int, ...]:
    return (*perm[:-2], perm[-1], perm[-2])


def _scale(view: View, x: str) -> tuple[str, float, Node | None]:
    """``x = s * c``, ``c * s`` or ``s / c`` with a one-element constant c: (s, scale, node); else (x, 1, None)."""
    node = view.producer(x, "Mul", "Div")
    if node is None:
        return x, 1.0, None
    if node.op == "Mul":
        for s, c in View.orders(node):
            if view.graph.scalar_constant(c) is not None and view.graph.scalar_constant(s) is None:
                return s, view.scalar_attr(c), node
    else:
        s, c = node.inputs
        value = view.graph.scalar_constant(c)
        if value is not None and value != 0:
            return s, 1.0 / view.scalar_attr(c), node
    return x, 1.0, None


def _find(view: View, mm2: Node, kv_block: int) -> Iterator[Fusion]:
    if mm2.op != "MatMul" or len(mm2.inputs) != 2:
        return
    p, v = mm2.inputs
    sm = view.producer(p, "Softmax")
    if sm is None:
        return
    x = sm.inputs[0]
    rank = len(view.shape(x))
    if effective_attrs(sm)["axis"] not in (-1, rank - 1):
        return
    # The softmax input: [Add(scores, mask)] over [Mul / Div by a scalar] over MatMul(q, kt).
    add = view.producer(x, "Add")
    candidates: list[tuple[str, str | None, Node | None]] = [(x, None, None)]
    if add is not None:
        candidates = [(a, b, add) for a, b in View.orders(add)] + candidates
    for scores, mask, add_node in candidates:
        s, scale, scale_node = _scale(view, scores)
        mm1 = view.producer(s, "MatMul")
        if mm1 is None or len(mm1.inputs) != 2:
            continue
        q, kt = mm1.inputs
        kt_shape = view.shape(kt)
        if len(kt_shape) < 2:
            continue
        k_shape = (*kt_shape[:-2], kt_shape[-1], kt_shape[-2])
        nodes = [mm1, sm, mm2] + [n for n in (scale_node, add_node) if n is not None]
        tr = view.producer(kt, "Transpose")
        if tr is not None and view.sole_reader(kt) is mm1:
            # Absorb the Transpose that made k^T: k is its source under the composed permutation.
            perm = tuple(effective_attrs(tr)["perm"] or reversed(range(len(kt_shape))))
            k_perm: tuple[int, ...] | None = _swap_last(perm)
            k_source, k_origin = tr.inputs[0], tr.origin
            if k_perm == tuple(range(len(k_perm))):
                k_perm = None
            nodes.append(tr)
        else:
            # k^T is any tensor: the kernel reads k as (..., Sk, D), so a Transpose makes it.
            k_source, k_perm, k_origin = kt, _swap_last(tuple(range(len(kt_shape)))), mm1.origin
        if k_perm is None:
            k_operand: str | np.ndarray = k_source
        else:
            k_operand = np.broadcast_to(np.zeros((), view.dtype(kt)), k_shape)
        inputs = (q, k_operand, v) + ((mask,) if mask is not None else ())
        attrs = op_attrs("Attention", scale=scale, kv_block=kv_block)
        yield _AttentionFusion(
            "FlashAttention", tuple(nodes), "Attention", inputs, mm2.outputs, attrs,
            k_source=k_source, k_perm=k_perm, k_origin=k_origin,
        )


@patterns("FlashAttention")
def flash_attention_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold scaled dot-product attention into one Attention node (MindSpore FlashAttentionFusionV1/V2).

    Identity: ``MatMul(Softmax(MatMul(q, k^T) * c + mask, axis=-1), v) == Attention(q, k, v, mask,
    scale=c)``; a Div by ``c`` is a scale of ``1 / c`` (one rounding of difference), no Mul is
    scale 1, no Add is no mask. The Attention kernel computes it block by block over the keys with
    an online softmax (codegen/attention.py), so the (Sq, Sk) scores never reach memory.

    ``k^T`` written by a Transpose that only the MatMul reads is absorbed: k is the Transpose's
    source under the permutation with its last two entries swapped (no node at all when that is
    the identity, else one Transpose in place of the old one). Any other ``k^T`` gets a Transpose
    of its last two axes. The split point ``kv_block`` (keys per block, 0 = all) becomes the
    node's ``kv_block`` attribute.

    Preconditions: both MatMuls have no bias; the Softmax runs over the last axis; the scale is a
    one-element constant; the mask is the other operand of an Add and broadcasts to the scores;
    q, k, v have one rank; the scores, the scaled and masked scores and the probabilities have no
    readers outside the pattern and are no graph outputs. Runs after SoftmaxFusionPass, which
    makes the Softmax node out of the decomposed form.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context (the ``kv_block`` split point, the allow hook).

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    kv_block = ctx.split("kv_block")
    return rewrite(graph, ctx, lambda view, node: _find(view, node, kv_block))
