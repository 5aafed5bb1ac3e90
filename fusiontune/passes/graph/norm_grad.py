"""LayerNormGradFusionPass and RmsNormGradFusionPass: a normalization's backward as one op that
reads the forward's saved statistics (MindSpore ``LayerNormGrad`` / ``RmsNormGrad``)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._grad import Keep, keep_or_expand, replace_node, with_attrs
from fusiontune.passes.graph._match import effective_attrs
from fusiontune.passes.pipeline import patterns

# Per forward op: where its normalized input is (an input index, or ("out", k) for the sum of an
# Add+norm), the index of gamma, and its outputs before the saved statistics.
_FORWARD = {
    "LayerNorm": (0, 1, 1),
    "AddLayerNorm": (None, 2, 2),
    "RMSNorm": (0, 1, 1),
    "AddRmsNorm": (None, 2, 2),
}
_STATS = {"LayerNormGrad": ("mean", "rstd"), "RmsNormGrad": ("rstd",)}
_FORWARD_OPS = {"LayerNormGrad": ("LayerNorm", "AddLayerNorm"), "RmsNormGrad": ("RMSNorm", "AddRmsNorm")}


def _forward_of(ed: GraphEditor, node: Node) -> Node | None:
    """The forward normalization whose backward ``node`` is: same input, gamma and attributes."""
    x, gamma = node.inputs[:2]
    want = effective_attrs(node)
    for n in ed.nodes:
        if n.op not in _FORWARD_OPS[node.op]:
            continue
        x_at, gamma_at, _ = _FORWARD[n.op]
        normalized = n.inputs[x_at] if x_at is not None else n.outputs[1]
        have = effective_attrs(n)
        if normalized == x and n.inputs[gamma_at] == gamma and all(have.get(k) == v for k, v in want.items()):
            return n
    return None


def _saved_statistics(ctx: PassContext) -> Keep:
    """Rewire a kept grad node to read the forward's statistics (split point ``recompute`` = 0)."""

    def keep(ed: GraphEditor, node: Node) -> None:
        names = _STATS[node.op]
        if ctx.split("recompute") or len(node.inputs) > 3:
            return
        fwd = _forward_of(ed, node)
        if fwd is None:
            return
        base = _FORWARD[fwd.op][2]
        if effective_attrs(fwd).get("save_stats"):
            saved = fwd.outputs[base:]
        else:
            x = ed.values[node.inputs[0]]
            saved = tuple(ed.add_value(ed.fresh(f"{fwd.name}/{s}"), (*x.shape[:-1], 1), x.dtype) for s in names)
            replace_node(ed, fwd, with_attrs(fwd, fwd.inputs, (*fwd.outputs, *saved), save_stats=1))
        replace_node(ed, node, with_attrs(node, (*node.inputs, *saved), node.outputs))

    return keep


@patterns("LayerNormGrad")
def layer_norm_grad_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Keep each LayerNormGrad node as one op and let it read the forward's mean and rstd.

    Identity: with ``x̂ = (x - mean) * rstd`` and ``ĝ = dy * gamma`` over the last axis,
    ``LayerNormGrad(x, gamma, dy) == (rstd * (ĝ - mean(ĝ) - x̂ * mean(ĝ * x̂)), dy * x̂)``, the
    primitive backward of LayerNorm / AddLayerNorm (their expansion, ir/expand.py), and
    ``LayerNormGrad(x, gamma, dy) == LayerNormGrad(x, gamma, dy, mean, rstd)`` where ``mean`` and
    ``rstd`` are the statistics the forward computed from the same ``x`` with the same ``eps`` and
    ``variance`` (written by the forward with ``save_stats=1``, as two per-row outputs of its
    kernel). Reading them saves the backward two of its four reductions over each row; the forward
    stores two floats per row. Split point ``recompute`` = 1 keeps the op but recomputes the
    statistics in its kernel (to measure the choice). Denied (or with the switch off, through
    GradExpanderPass), the node is spliced in as its primitive form.

    Preconditions: runs in the ``backward`` stage after AutodiffPass; a forward statistic is read
    only from a LayerNorm (AddLayerNorm) node whose normalized input (sum), gamma, ``eps`` and
    ``variance`` are the grad node's.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when it has no LayerNormGrad).
    """
    return keep_or_expand(graph, ctx, "LayerNormGrad", lambda g, n: "LayerNormGrad", _saved_statistics(ctx))


@patterns("RmsNormGrad")
def rms_norm_grad_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Keep each RmsNormGrad node as one op and let it read the forward's rstd.

    Identity: with ``r = 1 / sqrt(mean(x^2) + eps)`` and ``ĝ = dy * gamma``,
    ``RmsNormGrad(x, gamma, dy) == (r * ĝ - x * r^3 * mean(ĝ * x), dy * x * r)``, the primitive
    backward of RMSNorm / AddRmsNorm, and ``RmsNormGrad(x, gamma, dy) == RmsNormGrad(x, gamma, dy,
    r)`` with ``r`` the forward's (``save_stats=1``). Split point ``recompute`` = 1 recomputes it
    in the backward kernel instead.

    Preconditions: runs in the ``backward`` stage after AutodiffPass; ``r`` is read only from an
    RMSNorm (AddRmsNorm) node with the grad node's input (sum), gamma and ``eps``.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when it has no RmsNormGrad).
    """
    return keep_or_expand(graph, ctx, "RmsNormGrad", lambda g, n: "RmsNormGrad", _saved_statistics(ctx))
