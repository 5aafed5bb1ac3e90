"""RecomputeSplitFusionPass: recompute cheap forward values in the backward instead of storing them.

A training step's backward reads forward values (saved activations): a MatMul's gradient reads its
input, GELU's its input, LayerNorm's its input, the weight gradient of the FFN's second MatMul
reads the GELU output. Every one of them stays in memory from the forward kernel that made it to
the last backward kernel that reads it (the runtime frees a buffer after its last reader,
``fusiontune.runtime.program.plan_buffers``), and at the turn from forward to backward they are
all live at once: that is the step's planned peak.

This pass cuts such a value in two, as CANN's split fusion cuts an op: the forward copy (X1)
stays with the forward and dies after its last forward reader; a recomputed copy (X2), written
from values that stay stored anyway (the op's inputs when the backward reads them too, weights,
graph inputs), is placed just before its first backward reader, so the UBFusion passes fuse it
into the backward kernels. The split point ``recompute`` says which forward ops may be
recomputed:

* 0: none; every activation the backward reads is stored (no cut);
* 1: cheap elementwise ops (the basic ones: add, mul, max, casts...) and layout ops, chains of
  them up to ``MAX_CHAIN`` nodes (the GELU output ``x * Phi(x)`` from a stored ``x`` and
  ``Phi(x)``, a transposed key from the key);
* 2: also transcendental elementwise ops (erf, exp, tanh: a GELU from its input), normalizations
  and reductions: a LayerNorm / RMSNorm / Softmax output from its input (its row statistics
  recomputed), the normalized output of AddLayerNorm / AddRmsNorm from the stored sum
  (``RECOMPUTE_RULES``);
* 3: also the attention core, as Megatron-LM's selective recompute: an Attention node from the
  stored q, k, v, or a Softmax over MatMul scores (the MatMul under a Softmax in the chain).

Identity: a recomputed value is the same op over the same values as the one it replaces (or, for
the rules, ``AddLayerNorm(a, b)[0] == LayerNorm(a + b)`` with ``a + b`` the op's second output), so
the step's outputs are equal up to rounding (and bitwise where the kernels compute the same
expression the same way). Preconditions: a training step (``ctx.train``; an inference graph has
nothing saved and is returned unchanged) whose ``loss`` output names the end of the forward.

Which of the allowed values are recomputed is decided on the node order, with the buffers'
rule (a value lives from its node to its last reader): candidates go largest first, each placed
just before its first backward reader, and one is kept when the live bytes of the intermediates
reach no higher peak and fall in sum over the nodes (:func:`live_bytes`); a value whose first
backward reader is among the first ``MIN_GAP`` backward nodes stays stored (it would be freed and
made again at once), and a value that a chosen recomputation reads stays stored. Barriers keep
each recomputed node out of every forward kernel and out of the kernels of the other readers of
its inputs (a multi-output merge would move it away from its reader), and the group order keeps
the node order (``FusedGraph.with_groups``), so the kernels run where the nodes were placed.
Each recomputed value is one application (pattern ``Recompute``, the original nodes it recomputes),
so bisection can switch off one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.ir.ops import get_op
from fusiontune.ir.training import LOSS
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import patterns

PREFIX = "recompute/"
"""What the names of recomputed nodes and values start with."""

MAX_CHAIN = 8
"""The most forward nodes recomputed for one value."""

MIN_GAP = 4
"""A value whose first backward reader is among the first ``MIN_GAP`` backward nodes stays stored."""

LEVELS = {
    0: "store every activation the backward reads",
    1: "recompute cheap elementwise and layout chains",
    2: "also transcendental ops, normalizations and reductions",
    3: "also the attention core (Attention, or Softmax over MatMul scores)",
}

NORMALIZATIONS = ("LayerNorm", "RMSNorm", "Softmax", "LogSoftmax")

NodeSpec = tuple[str, tuple[str, ...], dict[str, object]]
"""``(op, inputs, attrs)`` of a node a rule writes."""
Rewrite = tuple[str, tuple[str, ...], dict[str, object], str]
"""``(op, inputs, attrs, output)``: the one node that makes ``output`` in place of its own."""
RecomputeRule = Callable[[Node, str], NodeSpec | None]


def _norm_of_sum(op: str) -> RecomputeRule:
    """``Add<op>(a, b, ...)`` output 0 is ``<op>(s, ...)`` with ``s = a + b``, its output 1.

    The copy saves no statistics (``save_stats = 0``): it makes the normalized value alone.
    """

    def rule(node: Node, value: str) -> NodeSpec | None:
        if value != node.outputs[0] or len(node.outputs) < 2:
            return None
        return op, (node.outputs[1], *node.inputs[2:]), {**node.attrs, "save_stats": 0}

    return rule


def _without_stats(node: Node, value: str) -> NodeSpec | None:
    """A norm that also saves its statistics, recomputed for its output 0 alone."""
    if value != node.outputs[0]:
        return None
    return node.op, node.inputs, {**node.attrs, "save_stats": 0}


RECOMPUTE_RULES: Mapping[str, tuple[int, RecomputeRule]] = {
    "AddLayerNorm": (2, _norm_of_sum("LayerNorm")),
    "AddRmsNorm": (2, _norm_of_sum("RMSNorm")),
    "LayerNorm": (2, _without_stats),
    "RMSNorm": (2, _without_stats),
}
"""Op -> (the level from which it applies, how one of its outputs is recomputed from others).

A rule returns ``(op, inputs, attrs)`` of one node that makes ``value`` alone, or None."""


def allowed(op: str, level: int, under_softmax: bool) -> bool:
    """May a node of ``op`` be recomputed at ``level`` (``under_softmax``: a Softmax reads it)?"""
    kind = get_op(op).kind
    if kind == "layout" or (kind == "elementwise" and get_op(op).basic):
        return level >= 1
    if kind in ("elementwise", "reduction") or op in NORMALIZATIONS:
        return level >= 2
    if op == "Attention":
        return level >= 3
    if op == "MatMul":
        return level >= 3 and under_softmax
    return False


def op_cost(op: str) -> int:
    """A rough price of recomputing one node: a basic elementwise or layout op 1, a
    transcendental or a reduction 4, a contraction or attention 16."""
    kind = get_op(op).kind
    if kind == "layout" or (kind == "elementwise" and get_op(op).basic):
        return 1
    if kind in ("elementwise", "reduction"):
        return 4
    return 16


@dataclass(frozen=True)
class Recomputation:
    """One value the backward will recompute.

    Attributes:
        value: the saved forward value.
        nodes: the forward nodes to copy, in graph order (the last one makes ``value``), each with
            the rule that rewrites it (``None``: copy it as is).
        leaves: the stored values the copies read.
        before: the first backward node that reads ``value``.
        nbytes: the bytes of ``value``.
    """

    value: str
    nodes: tuple[tuple[Node, Rewrite | None], ...]
    leaves: frozenset[str]
    before: str
    nbytes: int

    @property
    def origin(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o for n, _ in self.nodes for o in n.origin))


def forward_nodes(graph: Graph) -> set[str]:
    """The nodes of the forward and the loss: every node the ``loss`` output depends on."""
    producer = {o: n for n in graph.nodes for o in n.outputs}
    done: set[str] = set()
    stack = [LOSS] if LOSS in graph.values else []
    seen: set[str] = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        node = producer.get(v)
        if node is None or node.name in done:
            continue
        done.add(node.name)
        stack.extend(node.inputs)
    return done


def saved_activations(graph: Graph) -> dict[str, int]:
    """Forward values a backward node reads, with their bytes, in graph order.

    The forward is what the ``loss`` output depends on; the backward is every other node (the
    recomputed nodes this pass adds among them). Graph inputs, outputs and constants are not
    counted: they live for the whole step anyway.
    """
    fwd = forward_nodes(graph)
    if not fwd:
        return {}
    pinned = set(graph.inputs) | set(graph.outputs) | set(graph.constants)
    made_by_fwd = {o for n in graph.nodes if n.name in fwd for o in n.outputs}
    out: dict[str, int] = {}
    for n in graph.nodes:
        if n.name in fwd:
            continue
        for v in n.inputs:
            if v in made_by_fwd and v not in pinned:
                out[v] = graph.values[v].nbytes
    order = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


def plan_recompute(graph: Graph, level: int) -> list[Recomputation]:
    """The values the backward recomputes at ``level``, largest first (see the module doc).

    Each candidate is tried on the node order as it stands with the ones chosen before it, and
    kept when the live bytes of the intermediates, node by node, reach no higher peak and fall
    in sum (:func:`live_bytes`): the buffer plan of the grouped program follows the same order.
    """
    if level <= 0:
        return []
    fwd = forward_nodes(graph)
    saved = saved_activations(graph)
    if not saved:
        return []
    producer = {o: n for n in graph.nodes for o in n.outputs}
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    first_bw = min(pos[n.name] for n in graph.nodes if n.name not in fwd)
    first_read: dict[str, int] = {}
    for n in graph.nodes:
        if n.name not in fwd:
            for v in n.inputs:
                first_read.setdefault(v, pos[n.name])
    always = set(graph.inputs) | set(graph.constants)
    pinned = set(always) | set(graph.outputs)
    sizes = {name: v.nbytes for name, v in graph.values.items()}
    nodes = list(graph.nodes)
    taken = set(graph.values) | set(pos)
    peak, total = live_bytes(nodes, sizes, pinned)
    chosen: set[str] = set()
    kept: set[str] = set()  # saved values a chosen recomputation reads: they stay stored
    plans: list[Recomputation] = []

    def cost(value: str) -> int:
        """Nodes to recompute ``value`` with every other saved value stored (cheapest first)."""
        cone = _cone(value, level, producer, pos, always, set(saved) - {value})
        return 1 << 30 if cone is None else sum(op_cost(node.op) for node, _ in cone[0])

    # Largest first; of equal sizes the cheapest, so that GELU's x * Phi(x) is recomputed from a
    # stored Phi(x) rather than Phi(x) (an erf) from x, then x * Phi(x) with a second erf.
    for value in sorted(saved, key=lambda v: (-saved[v], cost(v), pos[producer[v].name])):
        if value in kept or first_read[value] - first_bw < MIN_GAP:
            continue
        before = next(n.name for n in nodes if n.name not in fwd and value in n.inputs)
        at = next(i for i, n in enumerate(nodes) if n.name == before)
        last = {v: i for i, n in enumerate(nodes) for v in n.inputs}
        stored = set(saved) - chosen - {value}
        dying = {v for v in stored if last.get(v, -1) < at and v not in kept}
        cone = _cone(value, level, producer, pos, always, stored, dying)
        if cone is None or any(leaf in chosen for leaf in cone[1]):
            continue
        plan = Recomputation(value, cone[0], frozenset(cone[1]), before, saved[value])
        trial, copies = _insert(nodes, plan, fwd, set(taken))
        new_sizes = {**sizes, **{o: sizes[src] for o, src in copies.items()}}
        new_peak, new_total = live_bytes(trial, new_sizes, pinned)
        if new_peak > peak or new_total >= total:
            continue
        nodes, sizes, peak, total = trial, new_sizes, new_peak, new_total
        taken |= set(copies) | {n.name for n in trial}
        chosen.add(value)
        kept.update(cone[1])
        plans.append(plan)
    return plans


def live_bytes(nodes: list[Node], sizes: Mapping[str, int], pinned: set[str]) -> tuple[int, int]:
    """The peak and the sum over nodes of the bytes of live intermediates, in this node order.

    A value lives from the node that makes it to the last node that reads it; ``pinned`` values
    (inputs, outputs, constants) are not counted: they live for the whole step anyway.
    """
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            last[v] = i
    delta = [0] * (len(nodes) + 1)
    for i, n in enumerate(nodes):
        for o in n.outputs:
            if o not in pinned:
                delta[i] += sizes[o]
                delta[max(i, last.get(o, i)) + 1] -= sizes[o]
    peak = total = live = 0
    for d in delta[:-1]:
        live += d
        peak = max(peak, live)
        total += live
    return peak, total


def _insert(
    nodes: list[Node], plan: Recomputation, fwd: set[str], taken: set[str]
) -> tuple[list[Node], dict[str, str]]:
    """``nodes`` with ``plan``'s copies just before its first backward reader, which (like every
    backward reader of the value) reads the copy. Returns the nodes and {new value: value}."""
    renamed: dict[str, str] = {}
    copies: list[Node] = []
    for node, rewrite in plan.nodes:
        op, inputs, attrs = (
            rewrite[:3] if rewrite is not None else (node.op, node.inputs, dict(node.attrs))
        )
        made = [rewrite[3]] if rewrite is not None else list(node.outputs)
        outs = [_unique(PREFIX + o, taken) for o in made]
        renamed.update(zip(made, outs, strict=True))
        copies.append(
            Node(
                _unique(PREFIX + node.name, taken),
                op,
                tuple(renamed.get(i, i) for i in inputs),
                tuple(outs),
                attrs,
                node.origin,
            )
        )
    new_value = renamed[plan.value]
    out: list[Node] = []
    for n in nodes:
        if n.name == plan.before:
            out.extend(copies)
        if n.name not in fwd and plan.value in n.inputs:
            n = Node(
                n.name,
                n.op,
                tuple(new_value if i == plan.value else i for i in n.inputs),
                n.outputs,
                n.attrs,
                n.origin,
            )
        out.append(n)
    return out, {new: old for old, new in renamed.items()}


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``... the first one not in ``taken`` (which it joins)."""
    k, candidate = 1, name
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate


def _cone(
    value: str,
    level: int,
    producer: Mapping[str, Node],
    pos: Mapping[str, int],
    always: set[str],
    stored: set[str],
    dying: Set[str] = frozenset(),
) -> tuple[tuple[tuple[Node, Rewrite | None], ...], set[str]] | None:
    """The nodes that make ``value`` again from ``stored`` and ``always`` values, or None.

    A ``dying`` stored value (its last reader comes before the copy would) is recomputed too
    where the level allows, so that it need not live longer; else it is read, and lives longer.
    """
    picked: dict[str, tuple[Node, Rewrite | None]] = {}
    leaves: set[str] = set()

    def visit(v: str, under_softmax: bool, root: bool) -> bool:
        if not root and v in dying:
            saved_picked, saved_leaves = dict(picked), set(leaves)
            if visit(v, under_softmax, True):
                return True
            picked.clear()
            picked.update(saved_picked)
            leaves.clear()
            leaves.update(saved_leaves)
        if not root and (v in stored or v in always):
            leaves.add(v)
            return True
        node = producer.get(v)
        if node is None:
            return False
        if node.name in picked:
            return True
        rewrite = None
        rule = RECOMPUTE_RULES.get(node.op)
        if rule is not None and level >= rule[0]:
            made = rule[1](node, v)
            rewrite = None if made is None else (*made, v)
        if rewrite is None and not allowed(node.op, level, under_softmax):
            return False
        if len(picked) >= MAX_CHAIN:
            return False
        inputs = rewrite[1] if rewrite is not None else node.inputs
        below = under_softmax or node.op in ("Softmax", "LogSoftmax")
        for i in dict.fromkeys(inputs):
            if not visit(i, below, False):
                return False
        picked[node.name] = (node, rewrite)
        return True

    if not visit(value, False, True):
        return None
    nodes = tuple(sorted(picked.values(), key=lambda nr: pos[nr[0].name]))
    return nodes, leaves


@patterns("Recompute")
def recompute_split_fusion(fused: FusedGraph, ctx: PassContext) -> FusedGraph:
    """Recompute saved activations in the backward (split point ``recompute``, see the module doc).

    Identity: ``y = f(x)`` read by the backward equals ``f(x)`` evaluated again from the stored
    ``x`` just before its first backward reader (up to rounding; the same op, or for Add+norm
    ``AddLayerNorm(a, b)[0] == LayerNorm(a + b)``). Preconditions: a training step whose forward
    ends in the ``loss`` output; runs before UB grouping, on a graph of singletons.
    """
    level = ctx.split("recompute")
    if level <= 0 or ctx.train is None:
        return fused
    graph = fused.graph
    plans = [p for p in plan_recompute(graph, level) if ctx.allow("Recompute", p.origin)]
    if not plans:
        return fused
    fwd = forward_nodes(graph)
    ed = GraphEditor(graph)
    taken = set(graph.values) | {n.name for n in graph.nodes}
    barriers: set[tuple[str, str]] = set(fused.barriers)
    for plan in plans:
        ed.nodes, copies = _insert(ed.nodes, plan, fwd, taken)
        for new, old in copies.items():
            ed.add_value(new, graph.values[old].shape, graph.values[old].dtype)
        # Keep each copy out of the forward's kernels and out of the kernels of the other readers
        # of what it reads: a multi-output merge with one would move it away from its reader.
        made = [n for n in ed.nodes if set(n.outputs) & set(copies)]
        names = {c.name for c in made}
        for c in made:
            barriers.update((c.name, f) for f in fwd)
            barriers.update(
                (c.name, n.name)
                for n in ed.nodes
                if n.name not in names and set(n.inputs) & set(c.inputs)
            )
    new_graph = ed.finish()
    live = {n.name for n in new_graph.nodes}
    return FusedGraph.singletons(
        new_graph, {(a, b) for a, b in barriers if a in live and b in live}
    )
