"""What the backward fusion passes share: which pass owns which grad op, keep-or-expand, splicing.

The mechanism (MindSpore's graph-kernel expanders, run the other way round): the vector-Jacobian
rules always write the fused grad ops (ir/_ops_grad.py). In the ``backward`` stage, after
AutodiffPass, each grad op's switchable pass asks ``ctx.allow`` for every node of its op: an
allowed node stays one op (one kernel; codegen lowers it through its expansion, a scalar rule or,
for AttentionGrad, a kernel of its own) and may be rewired to read the forward's saved
statistics; a denied one is replaced, in place, by its expansion (ir/expand.py), the primitive
form the rules wrote before these ops existed, which the UBFusion passes then group as usual.
GradExpanderPass, first in the stage after AutodiffPass and not switchable, expands the nodes of
every grad op whose pass is off. So with a switch off (``"ALL": "off"`` included) or an
application denied, that backward is exactly the primitive form.

An expansion may hold another grad op (AttentionGrad's holds a SoftmaxGrad): the passes run in
that order (AttentionGradFusionPass before SoftmaxGradFusionPass), so the inner op meets its own
switch afterwards; where that switch is off the expansion is expanded again at once
(:func:`expand_off`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fusiontune.ir.expand import expand
from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.passes.base import PassContext

OWNERS: Mapping[str, str] = {
    "SoftmaxGrad": "SoftmaxGradFusionPass",
    "LayerNormGrad": "LayerNormGradFusionPass",
    "RmsNormGrad": "RmsNormGradFusionPass",
    "GeluGrad": "GeluGradFusionPass",
    "ReluGrad": "ReluGradFusionPass",
    "AttentionGrad": "AttentionGradFusionPass",
}
"""Grad op -> the pass whose switch keeps it fused."""

Keep = Callable[[GraphEditor, Node], None]
"""Rewire a kept grad node (saved statistics); may replace nodes in the editor."""


def splice_expansion(ed: GraphEditor, node: Node) -> None:
    """Replace ``node`` in ``ed`` by its expansion; its outputs keep their names."""
    e = expand(node, ed.values)
    ed.remove_nodes([node.name])
    ed.values.update(e.values)
    ed.constants.update(e.constants)
    for n in e.nodes:
        ed.add_node(n)


def expand_off(ed: GraphEditor, node: Node, ctx: PassContext) -> None:
    """Splice ``node``'s expansion in, and expand again every grad op in it whose pass is off."""
    before = {n.name for n in ed.nodes}
    splice_expansion(ed, node)
    for n in [n for n in ed.nodes if n.name not in before]:
        if n.op in OWNERS and not ctx.config.enabled(OWNERS[n.op]):
            expand_off(ed, n, ctx)


def keep_or_expand(
    graph: Graph, ctx: PassContext, op: str, pattern: Callable[[Graph, Node], str], keep: Keep | None = None
) -> Graph:
    """Ask for every ``op`` node of ``graph`` (in graph order) under its ``pattern``: keep it (then
    ``keep`` rewires it) or, when denied, splice its expansion in. ``graph`` itself when none."""
    nodes = [n for n in graph.nodes if n.op == op]
    if not nodes:
        return graph
    ed = GraphEditor(graph)
    for node in nodes:
        current = next(n for n in ed.nodes if n.name == node.name)
        if ctx.allow(pattern(graph, node), application_nodes(graph, node)):
            if keep is not None:
                keep(ed, current)
        else:
            expand_off(ed, current, ctx)
    return ed.finish()


def application_nodes(graph: Graph, node: Node) -> tuple[str, ...]:
    """The original node names of one application: those of the forward node whose backward the
    grad node is (the rules write under the scope ``grad/<forward node>/``), then the grad node's
    own, so that bisection names the user's layer and two grad ops of one node stay apart."""
    scope = node.name.removeprefix("grad/").rpartition("/")[0]
    forward = next((n for n in graph.nodes if n.name == scope), None) if node.name.startswith("grad/") else None
    return (*(forward.origin if forward is not None else ()), *node.origin)


def producer(graph: Graph, value: str) -> Node | None:
    """The node of ``graph`` that writes ``value`` (None for inputs and constants)."""
    return next((n for n in graph.nodes if value in n.outputs), None)


def replace_node(ed: GraphEditor, old: Node, new: Node) -> None:
    """Put ``new`` where ``old`` was in the editor's node list."""
    ed.nodes = [new if n.name == old.name else n for n in ed.nodes]


def with_attrs(node: Node, inputs: tuple[str, ...], outputs: tuple[str, ...], **attrs: Any) -> Node:
    """``node`` with new inputs, outputs and extra attributes (name and origin kept)."""
    return Node(node.name, node.op, inputs, outputs, {**node.attrs, **attrs}, node.origin)
