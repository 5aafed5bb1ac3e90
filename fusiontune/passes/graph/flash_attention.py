"""FlashAttentionFusionPass: MatMul(q, k^T) [* scale] [+ mask] -> Softmax -> MatMul(., v) -> Attention."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusiontune.ir.graph import Graph, Node, Shape
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import (
    Fusion,
    Ref,
    Step,
    StepInput,
    View,
    effective_attrs,
    op_attrs,
)
from fusiontune.passes.pattern import Any, Builder, C, Match, P, Pattern, Rule, V, apply_rules
from fusiontune.passes.pipeline import patterns

MAX_CONCAT_COPIES = 16
"""Key/value heads repeated by a Concat of this many copies or fewer are recognized."""


# ---- the pattern ---------------------------------------------------------------------------------
def _scaled(p: Pattern, stem: str) -> Any:
    """``p * c``, ``p / c`` with a one-element constant c, or ``p`` itself."""
    return Any(
        P("Mul", p, C(f"{stem}_mul"), name=f"{stem}_scale"),
        P("Div", p, C(f"{stem}_div"), name=f"{stem}_scale"),
        p,
    )


def _repeated(p: str) -> Any:
    """Heads repeated along a leading axis (grouped-query attention's ``repeat_kv``), or ``p``.

    The repetition is an ``Expand`` of an axis of size 1 (after an ``Unsqueeze``, a Reshape in
    the IR), a ``Tile`` or a ``Concat`` of copies, with Reshapes that regroup the leading axes
    around it; :func:`_repeat` checks the shapes. The plain value comes last.
    """
    src = V(f"{p}_src")
    unsqueezed = P("Reshape", src, name=f"{p}_unsq")
    rep = Any(
        P("Expand", unsqueezed, name=f"{p}_rep"),
        P("Expand", src, name=f"{p}_rep"),
        P("Tile", unsqueezed, name=f"{p}_rep"),
        P("Tile", src, name=f"{p}_rep"),
        *(P("Concat", *(src,) * n, name=f"{p}_rep") for n in range(2, MAX_CONCAT_COPIES + 1)),
    )
    return Any(P("Reshape", rep, name=f"{p}_merge"), rep, V(p))


_K = _repeated("k")
# k^T: a Transpose of k; torch.onnx's dynamo form of ``k.transpose(-2, -1)``, which flattens the
# leading axes, swaps the last two and unflattens; or any tensor (a Transpose of it is added).
_KT = Any(
    P("Transpose", _K, name="kt_t"),
    P(
        "Reshape",
        P("Transpose", Any(P("Reshape", _K, name="kt_flat"), _K), name="kt_t"),
        name="kt_r",
    ),
    V("kt"),
)
_SCORES = P("MatMul", _scaled(V("q"), "q"), _scaled(_KT, "k"), name="mm1")
_SCALED = _scaled(_SCORES, "s")
_MASKED = Any(
    P("Add", P("Add", _SCALED, V("bias")), V("mask")), P("Add", _SCALED, V("mask")), _SCALED
)
_PROBS = P("Softmax", _MASKED, name="softmax")
# sdpa's guard for rows masked everywhere: Where(IsNaN(p), 0, p).
_GUARDED = Any(P("Where", P("IsNaN", _PROBS), C(value=0.0, tol=0.0), _PROBS, name="guard"), _PROBS)
PATTERN = P("MatMul", _GUARDED, _repeated("v"), name="mm2")


# ---- shapes --------------------------------------------------------------------------------------
def _swap_last(perm: tuple[int, ...]) -> tuple[int, ...]:
    return (*perm[:-2], perm[-1], perm[-2])


def _identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def _regroups_leading(view: View, node: Node) -> bool:
    """A Reshape that keeps the last two axes and regroups the leading (batch) ones only."""
    a, b = view.shape(node.inputs[0]), view.shape(node.outputs[0])
    return len(a) >= 2 and len(b) >= 2 and a[-2:] == b[-2:]


def _prod(shape: Shape) -> int:
    return int(np.prod(shape)) if shape else 1


@dataclass(frozen=True)
class _Repeat:
    """A value whose flattened leading index ``n`` reads ``src`` at
    ``(n // (groups * inner)) * inner + n % inner``: ``groups`` copies of each block of ``inner``
    heads (``inner == 1``: repeat_kv's interleaving; ``inner == KVH``: a Tile or Concat)."""

    src: str
    groups: int
    inner: int


def _repeat(m: Match, p: str) -> _Repeat | None:
    """The repetition :func:`_repeated` matched for operand ``p``, or None when there is none."""
    if not m.has_node(f"{p}_rep"):
        return None
    view, rep = m.view, m.node(f"{p}_rep")
    xs, ys = view.shape(rep.inputs[0]), view.shape(rep.outputs[0])
    rank = len(ys)
    if len(xs) != rank or rank < 3 or xs[-2:] != ys[-2:]:
        return None
    changed = [a for a in range(rank - 2) if xs[a] != ys[a]]
    if len(changed) != 1:
        return None
    (a,) = changed
    if rep.op == "Expand":
        if xs[a] != 1:
            return None
        groups, inner = ys[a], _prod(ys[a + 1 : rank - 2])
    else:  # Tile or Concat: copies of the whole of axis a
        if ys[a] % xs[a]:
            return None
        groups, inner = ys[a] // xs[a], _prod(xs[a : rank - 2])
    for name in (f"{p}_unsq", f"{p}_merge"):
        if m.has_node(name) and not _regroups_leading(view, m.node(name)):
            return None
    return _Repeat(m[f"{p}_src"], groups, inner)


@dataclass(frozen=True)
class _Split:
    """Leading axis ``axis`` of q's batch shape, viewed as ``sizes``: (outer,) groups, (inner,)."""

    axis: int
    sizes: tuple[int, ...]
    group_at: int

    def view(self, lead: Shape, full: Shape, repeated: bool = False) -> Shape | None:
        """The view of an operand with leading shape ``lead`` (q's is ``full``; aligned to it),
        or None when it does not broadcast that way. A repeated operand has 1 for the groups."""
        lead = (1,) * (len(full) - len(lead)) + tuple(lead)
        d = lead[self.axis]
        if d == 1:
            mid = (1,) * len(self.sizes)
        elif d == full[self.axis]:
            mid = tuple(
                1 if repeated and i == self.group_at else s for i, s in enumerate(self.sizes)
            )
        else:
            return None
        return (*lead[: self.axis], *mid, *lead[self.axis + 1 :])


def _split(lead: Shape, groups: int, inner: int) -> _Split | None:
    """How q's leading shape splits into (outer, groups, inner) blocks, or None."""
    suffix = 1
    for a in reversed(range(len(lead))):
        if inner % suffix == 0:
            y = inner // suffix
            if lead[a] % (groups * y) == 0:
                x = lead[a] // (groups * y)
                sizes = (*((x,) if x > 1 else ()), groups, *((y,) if y > 1 else ()))
                return _Split(a, sizes, int(x > 1))
        suffix *= lead[a]
    return None


# ---- the builder ---------------------------------------------------------------------------------
class _Steps:
    """The nodes a fusion adds before its Attention node, with the shapes of their outputs."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.steps: list[Step] = []
        self.shapes: list[Shape] = []

    def shape(self, x: StepInput) -> Shape:
        if isinstance(x, Ref):
            return self.shapes[x.step]
        if isinstance(x, str):
            return self.view.shape(x)
        return tuple(x.shape)

    def add(
        self,
        op: str,
        inputs: tuple[StepInput, ...],
        out_shape: Shape,
        origin: tuple[str, ...] | None = None,
        **attrs: object,
    ) -> Ref:
        self.steps.append(Step(op, inputs, op_attrs(op, **attrs), origin))
        self.shapes.append(tuple(out_shape))
        return Ref(len(self.steps) - 1)

    def reshape(self, x: StepInput, shape: Shape) -> StepInput:
        """``x`` as ``shape``: itself, a reshaped constant, or a new Reshape node."""
        shape = tuple(shape)
        if self.shape(x) == shape:
            return x
        if isinstance(x, str) and self.view.graph.is_constant(x):
            x = self.view.graph.constants[x]
        if isinstance(x, np.ndarray):
            return x.reshape(shape)
        return self.add("Reshape", (x,), shape, shape=shape)


def _scale(m: Match) -> float | None:
    """The product of the matched scale constants (a Div by c is a scale of 1 / c)."""
    found = []
    for stem in ("q", "k", "s"):
        if m.get(f"{stem}_mul") is not None:
            found.append(m.scalar(f"{stem}_mul"))
        elif m.get(f"{stem}_div") is not None:
            c = m.scalar(f"{stem}_div")
            if c == 0:
                return None
            found.append(1.0 / c)
    if len(found) == 1:
        return found[0]
    scale = np.dtype(m.view.dtype(m["q"])).type(np.prod(found) if found else 1.0)
    return float(np.format_float_positional(scale, unique=True, trim="-"))


def _k_source(m: Match) -> tuple[str, tuple[int, ...] | None, tuple[str, ...]] | None:
    """(k's source, the permutation of a Transpose that makes k of it or None, its origin).

    The source has k's layout ``(..., Sk, D)`` when no Transpose is needed; its leading axes may
    be grouped otherwise than k^T's (the dynamo form flattens them): a Reshape regroups them.
    """
    view = m.view
    if m.has_node("kt_t"):
        tr = m.node("kt_t")
        src = tr.inputs[0]
        rank = len(view.shape(src))
        k_perm = _swap_last(tuple(effective_attrs(tr)["perm"] or reversed(range(rank))))
        if m.has_node("kt_r"):
            # flatten -> swap the last two -> unflatten: k^T is the source's last two axes swapped
            regroups = [m.node(n) for n in ("kt_r", "kt_flat") if m.has_node(n)]
            if k_perm != _identity(rank) or not all(_regroups_leading(view, n) for n in regroups):
                return None
            if m.has_node("kt_flat"):
                src = m.node("kt_flat").inputs[0]
            return src, None, ()
        if k_perm == _identity(rank):
            return src, None, ()
        if m.has_node("k_rep"):
            return None  # a repetition under another permutation: the plain k matches instead
        return src, k_perm, tr.origin
    kt = m["kt"]
    return kt, _swap_last(_identity(len(view.shape(kt)))), m.node("mm1").origin


def _mask(m: Match, pre: _Steps) -> StepInput | None:
    """The additive mask operand: the mask, or the sum of the two additive terms (a new Add node
    outside the kernel, or a constant when both terms are constants)."""
    mask, bias = m.get("mask"), m.get("bias")
    if mask is None or bias is None:
        return mask
    g = m.view.graph
    if g.is_constant(mask) and g.is_constant(bias):
        a, b = g.constants[bias], g.constants[mask]
        return np.add(a, b, dtype=np.result_type(a.dtype, b.dtype))
    shape = np.broadcast_shapes(m.view.shape(bias), m.view.shape(mask))
    return pre.add("Add", (bias, mask), shape)


def _build(kv_block: int) -> Builder:
    def build(m: Match) -> Fusion | None:
        view = m.view
        scale, found = _scale(m), _k_source(m)
        if scale is None or found is None:
            return None
        k_src, k_perm, k_origin = found
        q = m["q"]
        q_shape, kt_shape = view.shape(q), view.shape(m.node("mm1").inputs[1])
        if len(q_shape) < 2 or len(kt_shape) < 2:
            return None
        lead, k_lead, sk_d = q_shape[:-2], kt_shape[:-2], (kt_shape[-1], kt_shape[-2])
        reps = {p: _repeat(m, p) for p in ("k", "v")}
        if any(m.has_node(f"{p}_rep") and reps[p] is None for p in reps):
            return None
        split = None
        found_reps = [r for r in reps.values() if r is not None]
        if found_reps:
            if len({(r.groups, r.inner) for r in found_reps}) != 1 or k_lead != lead:
                return None
            split = _split(lead, found_reps[0].groups, found_reps[0].inner)
            if split is None:
                return None

        pre = _Steps(view)
        mask = _mask(m, pre)
        k_rep, v_rep = reps["k"], reps["v"]
        if k_rep is not None:
            k: StepInput = k_rep.src
        elif k_perm is not None:
            k = pre.add("Transpose", (k_src,), (*k_lead, *sk_d), k_origin, perm=k_perm)
        else:
            k = k_src
        v: StepInput = v_rep.src if v_rep is not None else m["v"]
        v_shape = view.shape(m.node("mm2").inputs[1])
        q_view: Shape = lead
        if split is None:
            operands = [q, pre.reshape(k, (*k_lead, *sk_d)), v]
        else:
            views = (
                split.view(lead, lead),
                split.view(lead if k_rep else k_lead, lead, k_rep is not None),
                split.view(lead if v_rep else v_shape[:-2], lead, v_rep is not None),
            )
            if any(vw is None for vw in views):
                return None
            if v_rep is not None and _prod(v_shape[:-2]) != _prod(lead):
                return None
            q_view, k_view, v_view = (vw for vw in views if vw is not None)
            operands = [
                pre.reshape(q, (*q_view, *q_shape[-2:])),
                pre.reshape(k, (*k_view, *sk_d)),
                pre.reshape(v, (*v_view, *v_shape[-2:])),
            ]
        if mask is not None:
            if split is not None:
                mask = _grouped(pre, mask, split, lead)
                if mask is None:
                    return None
            operands.append(mask)
        attrs = op_attrs("Attention", scale=scale, kv_block=kv_block)
        out = m.nodes[0].outputs
        main = len(pre.steps)
        after: list[Step] = []
        if q_view != lead:  # the grouped view of the output, back to the heads
            after.append(Step("Reshape", (Ref(main),), {"shape": view.shape(out[0])}))
        if m.has_node("guard"):
            # sdpa zeroes the probabilities of a row masked everywhere (NaN in the softmax): the
            # kernel's output row is NaN there, and zeroing it gives the same row of zeros.
            result = Ref(main + len(after))
            isnan = Ref(main + len(after) + 1)
            zero = np.zeros((), view.dtype(out[0]))
            after += [Step("IsNaN", (result,)), Step("Where", (isnan, zero, result))]
        pattern = "FlashAttentionGqa" if split is not None else "FlashAttention"
        return Fusion(
            pattern,
            m.nodes,
            "Attention",
            tuple(operands),
            out,
            attrs,
            tuple(pre.steps),
            tuple(after),
        )

    return build


def _grouped(pre: _Steps, mask: StepInput, split: _Split, lead: Shape) -> StepInput | None:
    """The mask viewed like the scores of the grouped heads, or None when it has no such view."""
    shape = pre.shape(mask)
    rank = len(lead) + 2
    if len(shape) > rank:
        return None
    if len(shape) - 2 < len(lead) - split.axis:
        return mask  # it does not reach the split axis: it broadcasts as it is
    full = (1,) * (rank - len(shape)) + tuple(shape)
    mask_view = split.view(full[:-2], lead)
    if mask_view is None:
        return None
    return pre.reshape(mask, (*mask_view, *full[-2:]))


@patterns("FlashAttention", "FlashAttentionGqa")
def flash_attention_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Fold scaled dot-product attention into one Attention node (MindSpore FlashAttentionFusionV1/V2).

    Identity: ``MatMul(Softmax(MatMul(q, k^T) * c + mask, axis=-1), v) == Attention(q, k, v, mask,
    scale=c)``; a Div by ``c`` is a scale of ``1 / c`` (one rounding of difference), no Mul is
    scale 1, no Add is no mask. The Attention kernel computes it block by block over the keys with
    an online softmax (codegen/attention.py), so the (Sq, Sk) scores never reach memory.

    The spellings of real exports fold too (all pattern ``FlashAttention``):

    * the scale applied to q and to k^T separately, each as ``* c`` or ``/ c`` (torch's sdpa
      decomposition writes ``q * sqrt(s)`` and ``k^T * sqrt(s)``): the scale is the product;
    * two additive terms, ``(scores + bias) + mask`` (T5's position bias and its padding mask):
      ``softmax(s + b + m) == softmax(s + (b + m))``, so the mask operand is ``b + m``, a new Add
      outside the kernel, or one constant when both are constants (one rounding of difference);
    * sdpa's guard for rows masked everywhere, ``MatMul(Where(IsNaN(p), 0, p), v)``: a softmax
      row is all NaN or has no NaN, and for finite v the Attention kernel's output row is NaN
      exactly where p's is, so ``Where(IsNaN(Attention(...)), 0, Attention(...))`` after the
      kernel is the same (for a v holding inf or NaN the original keeps NaN where this gives 0).

    ``k^T`` written by a Transpose that only the MatMul reads is absorbed: k is the Transpose's
    source under the permutation with its last two entries swapped (no node at all when that is
    the identity, else one Transpose in place of the old one); the dynamo exporter's
    ``Reshape(Transpose(Reshape(k, (-1, Sk, D)), (0, 2, 1)), (..., D, Sk))`` is k itself, with its
    leading axes regrouped by a Reshape when they were flattened. Any other ``k^T`` gets a
    Transpose of its last two axes. The split point ``kv_block`` (keys per block, 0 = all)
    becomes the node's ``kv_block`` attribute.

    Grouped-query attention (pattern ``FlashAttentionGqa``): k and v with their heads repeated
    from (B, KVH, S, D) to (B, H, S, D), by ``Unsqueeze -> Expand -> Reshape`` (transformers'
    ``repeat_kv``: head h reads kv head h // G, G = H / KVH) or by a ``Tile`` or ``Concat`` of
    copies (head h reads kv head h % KVH), are read un-repeated: q is viewed as
    (B, KVH, G, S, D) (or (B, G, KVH, S, D)), k and v as (B, KVH, 1, S, D), the mask as the
    scores of that view, and the Attention node broadcasts the kv heads over the group: its
    output, viewed back as (B, H, S, Dv), is the same, and the repeated copies are never made
    (the views are Reshape nodes).

    Preconditions: both MatMuls have no bias; the Softmax runs over the last axis; the scales are
    one-element constants; the mask is the other operand of an Add (of two, for two terms) and
    broadcasts to the scores; q, k, v have one rank; the scores, the scaled and masked scores, the
    probabilities (and the repeated k and v) have no readers outside the pattern and are no graph
    outputs; for grouped-query attention, k and v repeat their heads the same way (or one of them
    is not repeated), and q's head axis splits into the groups. Runs after SoftmaxFusionPass,
    which makes the Softmax node out of the decomposed form.

    Args:
        graph: the graph to rewrite.
        ctx: the pass context (the ``kv_block`` split point, the allow hook).

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    rules = (Rule("FlashAttention", PATTERN, _build(ctx.split("kv_block"))),)
    return apply_rules(graph, ctx, rules)
