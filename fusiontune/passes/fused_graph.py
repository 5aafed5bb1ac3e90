"""FusedGraph: a graph plus its partition into fused groups (one group = one kernel).

UBFusion passes work on this record: they merge, cut and annotate groups. Every node belongs to
exactly one group; a graph nobody has grouped is all singletons, which is the "all off" program
where every op is its own kernel.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from fusiontune.ir.graph import Graph


@dataclass(frozen=True)
class Group:
    """A set of nodes that becomes one kernel.

    Attributes:
        name: stable name (its first node's name, prefixed ``fused_`` when it holds several).
        nodes: node names in topological order.
        passes: the UBFusion passes that formed or changed it.
        schedule: codegen hints set by split passes, e.g. ``{"row_block": 64}``.
    """

    name: str
    nodes: tuple[str, ...]
    passes: tuple[str, ...] = ()
    schedule: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", MappingProxyType(dict(self.schedule)))


@dataclass(frozen=True, eq=False)
class FusedGraph:
    """A graph and its groups, groups in a topological order of the group DAG."""

    graph: Graph
    groups: tuple[Group, ...]
    barriers: frozenset[tuple[str, str]] = frozenset()

    @staticmethod
    def singletons(graph: Graph, barriers: Iterable[tuple[str, str]] = ()) -> FusedGraph:
        """Every node its own group; ``barriers`` are node pairs no group may hold together."""
        return FusedGraph(graph, tuple(Group(n.name, (n.name,)) for n in graph.nodes), frozenset(barriers))

    @property
    def kernel_count(self) -> int:
        return len(self.groups)

    def group_of(self) -> dict[str, str]:
        """node name -> group name."""
        return {n: g.name for g in self.groups for n in g.nodes}

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def with_groups(self, groups: Iterable[Group]) -> FusedGraph:
        """A new FusedGraph with ``groups`` re-ordered topologically and node order normalized."""
        order = {n.name: i for i, n in enumerate(self.graph.nodes)}
        normalized = [replace(g, nodes=tuple(sorted(g.nodes, key=order.__getitem__))) for g in groups]
        seen = [n for g in normalized for n in g.nodes]
        if sorted(seen) != sorted(order):
            missing = set(order) - set(seen)
            extra = [n for n in seen if n not in order or seen.count(n) > 1]
            raise ValueError(f"groups do not partition the graph: missing {sorted(missing)[:5]}, extra {extra[:5]}")
        return FusedGraph(self.graph, tuple(_topo_groups(self.graph, normalized)), self.barriers)


def _topo_groups(graph: Graph, groups: list[Group]) -> list[Group]:
    """Order groups so that every group comes after the groups it reads from.

    Of the groups whose inputs are ready, the one whose first node comes first in the graph runs
    next: the kernels keep the graph's node order wherever the grouping allows, so a pass that
    places a node (a recomputation just before its backward reader) places its kernel, and a
    buffer lives no longer than the node order says.

    Raises:
        ValueError: the grouping is not convex (two groups depend on each other).
    """
    owner = {n: g.name for g in groups for n in g.nodes}
    producer = {o: owner[n.name] for n in graph.nodes for o in n.outputs}
    deps: dict[str, set[str]] = {g.name: set() for g in groups}
    for n in graph.nodes:
        for i in n.inputs:
            src = producer.get(i)
            if src is not None and src != owner[n.name]:
                deps[owner[n.name]].add(src)
    first = {g.name: min(graph.node_position(n) for n in g.nodes) for g in groups}
    by_name = {g.name: g for g in groups}
    users: dict[str, list[str]] = {g: [] for g in by_name}
    for g, srcs in deps.items():
        for src in srcs:
            users[src].append(g)
    waiting = {g: len(srcs) for g, srcs in deps.items()}
    ready = [(first[g], g) for g, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    ordered: list[Group] = []
    while ready:
        _, g = heapq.heappop(ready)
        ordered.append(by_name[g])
        for u in users[g]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (first[u], u))
    if len(ordered) < len(groups):
        pending = sorted((g for g, n in waiting.items() if n > 0), key=first.__getitem__)
        raise ValueError("fused groups form a cycle: " + ", ".join(pending[:4]))
    return ordered
