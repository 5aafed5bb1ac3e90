"""Shared machinery of the UBFusion passes: a mutable partition, legal merges, and committing.

A UBFusion pass proposes merges greedily on a :class:`Partition`, then :func:`commit` asks
``ctx.allow`` once per proposed kernel (its pattern and its original node names). A refused
proposal falls back to the groups it was made of, which is how bisection switches off one fused
kernel out of many.

A merge is legal when no barrier pair ends up in one group, the group DAG stays acyclic (no path
leaves one of the two groups and re-enters the other), and a kernel template can run the merged
nodes as one kernel (:func:`fusiontune.codegen.plan.check_fusable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fusiontune.codegen.plan import check_fusable
from fusiontune.codegen.rules import LAYOUT_OPS, OPAQUE_OPS, WINDOW_OPS
from fusiontune.ir.ops import get_op
from fusiontune.passes.base import PassContext
from fusiontune.passes.fused_graph import FusedGraph, Group


class Partition:
    """Groups as mutable node lists, with the group DAG computed on demand."""

    def __init__(self, fused: FusedGraph) -> None:
        self.fused = fused
        self.graph = fused.graph
        self.barriers = fused.barriers
        self.members: dict[int, list[str]] = {}
        self.owner: dict[str, int] = {}
        self.origin_groups: dict[int, list[Group]] = {}
        self.schedule: dict[int, dict[str, int]] = {}
        for i, g in enumerate(fused.groups):
            self.members[i] = list(g.nodes)
            self.origin_groups[i] = [g]
            self.schedule[i] = dict(g.schedule)
            for n in g.nodes:
                self.owner[n] = i
        self.producer = {o: n.name for n in self.graph.nodes for o in n.outputs}
        self._readers: dict[str, list[str]] = {}
        for node in self.graph.nodes:
            for value in dict.fromkeys(node.inputs):
                self._readers.setdefault(value, []).append(node.name)

    # ---- queries ------------------------------------------------------------------------------
    def ops(self, gid: int) -> list[str]:
        return [self.graph.node(n).op for n in self.members[gid]]

    def kind(self, gid: int) -> str:
        """contraction (holds a MatMul), conv (holds a Conv), window (a pool node), layout (a
        layout node), or loop. Conv and window groups are no loop nests: only the conv epilogue
        pass (passes/ub/conv_epilogue.py) merges into a conv group."""
        ops = self.ops(gid)
        if "MatMul" in ops:
            return "contraction"
        if "Conv" in ops:
            return "conv"
        if any(op in WINDOW_OPS for op in ops):
            return "window"
        if any(op in LAYOUT_OPS for op in ops):
            return "layout"
        if "Attention" in ops:
            return "attention"  # a flash-attention kernel of its own (codegen/attention.py)
        if any(op in OPAQUE_OPS for op in ops):
            return "opaque"  # a kernel of its own (codegen/rotary.py)
        return "loop"

    def is_basic_eltwise(self, gid: int) -> bool:
        return all(get_op(op).kind == "elementwise" and get_op(op).basic for op in self.ops(gid))

    def readers(self, value: str) -> list[str]:
        return self._readers.get(value, [])

    def successors(self, gid: int) -> set[int]:
        out: set[int] = set()
        for n in self.members[gid]:
            for o in self.graph.node(n).outputs:
                for r in self.readers(o):
                    if self.owner[r] != gid:
                        out.add(self.owner[r])
        return out

    def predecessors(self, gid: int) -> set[int]:
        out: set[int] = set()
        for n in self.members[gid]:
            for i in self.graph.node(n).inputs:
                p = self.producer.get(i)
                if p is not None and self.owner[p] != gid:
                    out.add(self.owner[p])
        return out

    def group_ids(self) -> list[int]:
        """Group ids in the order of their first node."""
        pos = self.graph.node_position
        return sorted(self.members, key=lambda g: min(pos(n) for n in self.members[g]))

    def origins(self, gid: int) -> list[str]:
        names: dict[str, None] = {}
        for n in self.members[gid]:
            for o in self.graph.node(n).origin:
                names[o] = None
        return list(names)

    # ---- merging ------------------------------------------------------------------------------
    def _reaches(self, src: int, dst: int, skip_direct: bool) -> bool:
        """Is there a path src -> ... -> dst in the group DAG (through another group when skip_direct)?"""
        start = [s for s in self.successors(src) if not (skip_direct and s == dst)]
        seen: set[int] = set()
        stack = start
        while stack:
            g = stack.pop()
            if g == dst:
                return True
            if g in seen:
                continue
            seen.add(g)
            stack.extend(self.successors(g))
        return False

    def can_merge(self, a: int, b: int, schedule: dict[str, int] | None = None) -> bool:
        if a == b:
            return False
        nodes_a, nodes_b = set(self.members[a]), set(self.members[b])
        for x, y in self.barriers:
            if (x in nodes_a and y in nodes_b) or (x in nodes_b and y in nodes_a):
                return False
        if self._reaches(a, b, True) or self._reaches(b, a, True):
            return False
        merged = sorted(nodes_a | nodes_b, key=self.graph.node_position)
        sched = schedule if schedule is not None else {**self.schedule[a], **self.schedule[b]}
        return check_fusable(self.graph, merged, sched) is None

    def merge(self, a: int, b: int) -> int:
        """Merge b into a; return a."""
        for n in self.members[b]:
            self.owner[n] = a
        self.members[a] = sorted(self.members[a] + self.members[b], key=self.graph.node_position)
        self.origin_groups[a] += self.origin_groups[b]
        self.schedule[a] = {**self.schedule[a], **self.schedule[b]}
        del self.members[b], self.origin_groups[b], self.schedule[b]
        return a

    def try_merge(self, a: int, b: int) -> int | None:
        if self.can_merge(a, b):
            return self.merge(a, b)
        return None


def commit(
    part: Partition,
    ctx: PassContext,
    pass_name: str,
    pattern: Callable[[Partition, int], str],
) -> FusedGraph:
    """Ask ``ctx.allow`` for every group the pass formed from several; rebuild the FusedGraph.

    Args:
        part: the partition after the pass's proposals.
        ctx: the pass context.
        pass_name: recorded in the groups' ``passes``.
        pattern: names the pattern of a proposed group (for the log).
    """
    groups: list[Group] = []
    for gid in part.group_ids():
        parts = part.origin_groups[gid]
        if len(parts) == 1:
            old = parts[0]
            sched = part.schedule[gid]
            if dict(old.schedule) != sched:
                groups.append(Group(old.name, old.nodes, (*old.passes, pass_name), sched))
            else:
                groups.append(old)
            continue
        if ctx.allow(pattern(part, gid), part.origins(gid)):
            first = part.members[gid][0]
            passes = tuple(dict.fromkeys([p for g in parts for p in g.passes] + [pass_name]))
            groups.append(Group(f"fused_{first}", tuple(part.members[gid]), passes, part.schedule[gid]))
        else:
            groups.extend(parts)
    return part.fused.with_groups(groups)


def loop_groups(part: Partition) -> Iterable[int]:
    return [g for g in part.group_ids() if part.kind(g) == "loop"]
