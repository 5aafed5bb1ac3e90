"""GeluGradFusionPass: GELU's backward as one GeluGrad op that reads the forward's gate Phi(x)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._grad import Keep, keep_or_expand, replace_node, with_attrs
from fusiontune.passes.pipeline import patterns


def _approximate(node: Node) -> str:
    return str(node.attr("approximate", "none"))


def _saved_gate(ctx: PassContext) -> Keep:
    """Make the forward Gelu keep its gate and the grad node read it (split point ``recompute`` = 0)."""

    def keep(ed: GraphEditor, node: Node) -> None:
        if ctx.split("recompute") or len(node.inputs) > 2:
            return
        x, mode = node.inputs[0], _approximate(node)
        same = [n for n in ed.nodes if n.inputs[:1] == (x,) and _approximate(n) == mode]
        cdf = next((n.outputs[0] for n in same if n.op == "GeluCdf"), None)
        if cdf is None:
            gelu = next((n for n in same if n.op == "Gelu"), None)
            if gelu is None:
                return
            v = ed.values[x]
            cdf = ed.add_value(ed.fresh(f"{gelu.name}/cdf"), v.shape, v.dtype)
            attrs = {"approximate": mode} if mode != "none" else {}
            ed.add_node(Node(f"{gelu.name}/GeluCdf", "GeluCdf", (x,), (cdf,), attrs, gelu.origin))
            replace_node(ed, gelu, Node(gelu.name, "Mul", (x, cdf), gelu.outputs, {}, gelu.origin))
        replace_node(ed, node, with_attrs(node, (*node.inputs, cdf), node.outputs))

    return keep


@patterns("GeluGrad")
def gelu_grad_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Keep each GeluGrad node as one op, reading the gate the forward computed.

    Identity: ``Gelu(x) == x * GeluCdf(x)`` with ``GeluCdf(x) = Phi(x) = (1 + erf(x / sqrt 2)) / 2``
    (tanh form: ``(1 + tanh(u)) / 2``), and
    ``GeluGrad(x, dy) == dy * (Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi))`` (tanh form:
    ``dy * (c + 2 x c (1 - c) u')``), the primitive backward (its expansion, ir/expand.py), so
    ``GeluGrad(x, dy) == GeluGrad(x, dy, GeluCdf(x))``. The forward Gelu becomes
    ``GeluCdf`` then ``Mul``, one kernel that also stores the gate, and the backward evaluates no
    erf (no tanh): numba here has no vector libm, so each erf is a scalar call. Split point
    ``recompute`` = 1 keeps the op but recomputes the gate in the backward (the forward stays one
    Gelu). Denied (or with the switch off, through GradExpanderPass), the node is spliced in as
    its primitive form, which recomputes erf.

    Preconditions: runs in the ``backward`` stage after AutodiffPass; the gate is read only from a
    Gelu (or GeluCdf) node of the grad node's ``x`` with its ``approximate`` attribute.

    Args:
        graph: the training step.
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when it has no GeluGrad).
    """
    return keep_or_expand(graph, ctx, "GeluGrad", lambda g, n: "GeluGrad", _saved_gate(ctx))
