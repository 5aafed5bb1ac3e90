"""IdentityEliminationPass: drop nodes that return their input unchanged."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import Forwarder, View, effective_attrs
from fusiontune.passes.pipeline import patterns

# (op, neutral scalar, whether the scalar may be the first operand)
_NEUTRAL = {"Mul": (1.0, True), "Add": (0.0, True), "Sub": (0.0, False), "Div": (1.0, False)}


def _same_as_output(view: View, node: Node, x: str) -> bool:
    out = node.outputs[0]
    return (view.shape(x), view.dtype(x)) == (view.shape(out), view.dtype(out))


def _identity_input(view: View, node: Node) -> tuple[str, str] | None:
    """(pattern, the input the node passes through) when ``node`` is a no-op."""
    if node.op in ("Reshape", "Expand", "Cast"):
        x = node.inputs[0]
        return (f"NoOp{node.op}", x) if _same_as_output(view, node, x) else None
    if node.op == "Transpose":
        rank = len(view.shape(node.inputs[0]))
        perm = tuple(effective_attrs(node).get("perm") or reversed(range(rank)))
        return ("NoOpTranspose", node.inputs[0]) if perm == tuple(range(rank)) else None
    if node.op in _NEUTRAL:
        neutral, commutative = _NEUTRAL[node.op]
        orders = View.orders(node) if commutative else iter([node.inputs])
        for x, c in orders:
            # Exact comparison: x * 1.0000001 is not an identity.
            if view.scalar_is(c, neutral, tol=0.0) and _same_as_output(view, node, x):
                return ("ArithIdentity", x)
    return None


@patterns("NoOpReshape", "NoOpTranspose", "NoOpCast", "NoOpExpand", "ArithIdentity")
def identity_elimination(graph: Graph, ctx: PassContext) -> Graph:
    """Remove nodes that return their input: readers of the output read the input instead.

    Identities: ``Reshape(x, shape(x)) == x``, ``Expand(x, shape(x)) == x``,
    ``Cast(x, dtype(x)) == x``, ``Transpose(x, (0, 1, ..., r-1)) == x``, and with exact scalar
    constants ``x * 1 == 1 * x == x + 0 == 0 + x == x - 0 == x / 1 == x``.

    Preconditions: the output has the input's shape and dtype (a scalar operand must not
    broadcast or promote x). When the output is a graph output, the input must be written by a
    node and not be a graph output itself, so the output keeps its name; otherwise the node stays.

    Args:
        graph: the graph to simplify.
        ctx: the pass context; one application per removed node.

    Returns:
        The simplified graph (``graph`` itself when nothing is removed).
    """
    view = View(graph)
    editor = GraphEditor(graph)
    forwarder = Forwarder(view)
    changed = False
    for node in graph.nodes:
        hit = _identity_input(view, node)
        if hit is None:
            continue
        pattern, x = hit
        if not forwarder.can_forward(node.outputs[0], x) or not ctx.allow(pattern, node.origin):
            continue
        editor.remove_nodes([node.name])
        forwarder.forward(node.outputs[0], x)
        changed = True
    if not changed:
        return graph
    forwarder.apply(editor)
    return editor.finish()
