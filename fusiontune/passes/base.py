"""The pass contract: what a pass declares, what it may ask of its context, what it reports.

A pass is declared once, in the registry table (``fusiontune.passes.registry.PASSES``), by a
:class:`PassInfo`. Its ``run`` function finds matches and rewrites:

* a ``GraphFusion`` pass: ``run(graph: Graph, ctx: PassContext) -> Graph``;
* a ``UBFusion`` pass: ``run(fused: FusedGraph, ctx: PassContext) -> FusedGraph``.

Before each rewrite the pass asks ``ctx.allow(pattern, nodes)``. That counts the match
(``matched_times``), and when it returns True the pass must apply the rewrite, which counts as
``effected_times``. The application id, ``(pass, index)`` with the original node names it touches,
is stable for a given graph and configuration: that is what lets bisection switch off one fusion
out of many.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fusiontune.config.fusion_config import FusionConfig
    from fusiontune.ir.training import TrainSpec

GRAPH_FUSION = "GraphFusion"
UB_FUSION = "UBFusion"
KINDS = (GRAPH_FUSION, UB_FUSION)


@dataclass(frozen=True)
class SplitPoint:
    """A named integer a split-fusion pass exposes. 0 always means "no cut".

    Attributes:
        name: the point's name; its search parameter is ``split.<Pass>.<name>``.
        low: smallest allowed value (0).
        high: largest allowed value.
        doc: what the value means.
        choices: the values worth searching, when not every integer in [low, high] is.
    """

    name: str
    low: int
    high: int
    doc: str
    choices: tuple[int, ...] = ()

    def check(self, value: int) -> None:
        if not self.low <= value <= self.high:
            raise ValueError(f"split point {self.name} must be in [{self.low}, {self.high}], got {value}")


@dataclass(frozen=True)
class PassInfo:
    """One row of the registry.

    Attributes:
        name: CANN-style name, as written in fusion_switch.cfg (``ConvBatchnormFusionPass``).
        aliases: MindSpore-style names accepted in graph_kernel_flags (``add_layer_norm_fusion``).
        kind: ``GraphFusion`` (math rewrite, hardware independent) or ``UBFusion`` (kernel grouping
            that keeps intermediates in cache).
        default: on unless the configuration says otherwise.
        switchable: False for passes needed for correctness: ``"ALL":"off"`` leaves them on and an
            explicit off is an error.
        exact: False when the rewrite changes numerics beyond rounding.
        split_points: the integer parameters of a split-fusion pass.
        entry: ``"module:function"`` of the run function, imported on first use.
        summary: one line for ``fusiontune passes``.
        stage: where the pipeline runs it, one of ``registry.STAGES``: canonicalize, graph,
            split_pre, ub_epilogue, ub_basic, ub_composite, ub_multi, split_post, precision.
        expected_error: for inexact passes, the relative error the rewrite may add.
    """

    name: str
    aliases: tuple[str, ...]
    kind: str
    default: bool
    switchable: bool
    exact: bool
    split_points: tuple[SplitPoint, ...]
    entry: str
    summary: str
    stage: str
    expected_error: float = 0.0

    def load(self) -> Callable[..., Any]:
        module, func = self.entry.split(":")
        return getattr(importlib.import_module(module), func)

    @property
    def doc(self) -> str:
        """The run function's docstring: the identity the pass relies on and its preconditions."""
        return (self.load().__doc__ or "").strip()


@dataclass(frozen=True)
class Application:
    """One rewrite a pass made (or was denied): the unit bisection switches off."""

    pass_name: str
    index: int
    pattern: str
    nodes: tuple[str, ...]
    applied: bool


@dataclass(frozen=True)
class PatternStat:
    """matched_times / effected_times for one (pass, pattern), in execution order."""

    pass_name: str
    kind: str
    pattern: str
    matched_times: int
    effected_times: int

    def log_line(self) -> str:
        """CANN's line, e.g. ``GraphFusionPass[X]: pattern=P, matched_times=2, effected_times=2``."""
        return (
            f"{self.kind}Pass[{self.pass_name}]: pattern={self.pattern}, "
            f"matched_times={self.matched_times}, effected_times={self.effected_times}"
        )


@dataclass(frozen=True)
class FusionReport:
    """What the pipeline did: per-pattern statistics in execution order, and every application."""

    stats: tuple[PatternStat, ...]
    applications: tuple[Application, ...]
    passes_run: tuple[str, ...]

    @staticmethod
    def empty() -> FusionReport:
        """No pass ran (a failed build, or a job that reported nothing)."""
        return FusionReport((), (), ())

    @staticmethod
    def from_counts(counts: Mapping[str, tuple[int, int]], kinds: Mapping[str, str] | None = None) -> FusionReport:
        """A report from per-pass ``(matched_times, effected_times)`` (a job's ``fusion_result.json``).

        Each pass gets one stat whose pattern is the pass's name without ``Pass``; its kind comes
        from ``kinds`` (default ``GraphFusion``).
        """
        kinds = kinds or {}
        stats = tuple(
            PatternStat(name, kinds.get(name, GRAPH_FUSION), name.removesuffix("Pass"), int(m), int(e))
            for name, (m, e) in counts.items()
        )
        return FusionReport(stats, (), tuple(counts))

    def to_json(self) -> dict[str, Any]:
        return {
            "stats": [[s.pass_name, s.kind, s.pattern, s.matched_times, s.effected_times] for s in self.stats],
            "applications": [[a.pass_name, a.index, a.pattern, list(a.nodes), a.applied] for a in self.applications],
            "passes_run": list(self.passes_run),
        }

    @staticmethod
    def from_json(data: Any, applications: Any = ()) -> FusionReport:
        """A report from :meth:`to_json`; also the first version's ``{pass: [matched, effected]}``
        with its applications stored beside it."""
        if not data:
            data = {}
        if "stats" not in data:  # the first version: per-pass counts
            report = FusionReport.from_counts({k: (v[0], v[1]) for k, v in dict(data).items()})
            data = {"stats": [], "passes_run": list(report.passes_run), "applications": applications}
            stats = report.stats
        else:
            stats = tuple(PatternStat(str(p), str(k), str(pat), int(m), int(e)) for p, k, pat, m, e in data["stats"])
        apps = tuple(
            Application(str(p), int(i), str(pat), tuple(nodes), bool(ok))
            for p, i, pat, nodes, ok in data.get("applications") or ()
        )
        return FusionReport(stats, apps, tuple(data.get("passes_run") or ()))

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per pass, ``(matched_times, effected_times)`` over its patterns, in execution order."""
        out: dict[str, tuple[int, int]] = {}
        for s in self.stats:
            m, e = out.get(s.pass_name, (0, 0))
            out[s.pass_name] = (m + s.matched_times, e + s.effected_times)
        return out

    def log_lines(self) -> list[str]:
        return [s.log_line() for s in self.stats]

    def effected(self, pass_name: str) -> int:
        return sum(s.effected_times for s in self.stats if s.pass_name == pass_name)

    def matched(self, pass_name: str) -> int:
        return sum(s.matched_times for s in self.stats if s.pass_name == pass_name)

    def to_fusion_result(self, graph_id: int = 0) -> dict[str, Any]:
        """CANN's ``fusion_result.json`` shape: per session/graph, per kind, per pass counts."""
        sections: dict[str, dict[str, dict[str, str]]] = {"graph_fusion": {}, "ub_fusion": {}}
        for s in self.stats:
            key = "graph_fusion" if s.kind == GRAPH_FUSION else "ub_fusion"
            entry = sections[key].setdefault(s.pass_name, {"match_times": "0", "effect_times": "0"})
            entry["match_times"] = str(int(entry["match_times"]) + s.matched_times)
            entry["effect_times"] = str(int(entry["effect_times"]) + s.effected_times)
        return {"graphId": str(graph_id), "session_and_graph_id": f"0_{graph_id}", **sections}


@dataclass
class PassContext:
    """What a running pass may see and ask: the configuration, split points, the allow hook.

    A pass may run more than once in one context (the pipeline repeats the canonicalize stage
    until it reaches a fixed point). Its later runs continue its application indices, so every
    application of a pass has its own index; their counts add to the pass's first stats, so the
    report names each (pass, pattern) once, where it first ran; and an application denied in an
    earlier run (same pattern, same original nodes) is denied again without being counted or
    recorded again.

    Attributes:
        config: the resolved configuration (which passes are on, split point values).
        deny: applications to refuse, ``{pass name: {index, ...}}`` (bisection's second step).
        train: the training step to build (the ``backward`` stage), or None for inference.
    """

    config: FusionConfig
    deny: Mapping[str, frozenset[int]] = field(default_factory=dict)
    train: TrainSpec | None = None
    current: PassInfo | None = None
    _stats: list[PatternStat] = field(default_factory=list)
    _apps: list[Application] = field(default_factory=list)
    _counts: dict[str, list[int]] = field(default_factory=dict)
    _index: int = 0
    _next_index: dict[str, int] = field(default_factory=dict)
    _stat_at: dict[tuple[str, str], int] = field(default_factory=dict)
    _denied: dict[str, set[tuple[str, tuple[str, ...]]]] = field(default_factory=dict)
    _denied_before: frozenset[tuple[str, tuple[str, ...]]] = frozenset()

    def begin(self, info: PassInfo) -> None:
        self.current = info
        self._counts = {}
        self._index = self._next_index.get(info.name, 0)
        self._denied_before = frozenset(self._denied.get(info.name, ()))

    def end(self, patterns: Iterable[str] = ()) -> None:
        """Close the pass: one stat per pattern it tried (declared patterns with 0 matches too).

        A pass that ran before in this context adds its counts to the stats of its first run.
        """
        info = self.current
        assert info is not None
        for p in patterns:
            self._counts.setdefault(p, [0, 0])
        if not self._counts and info.name not in self._next_index:
            self._counts[info.name.removesuffix("Pass")] = [0, 0]
        for pattern, (m, e) in self._counts.items():
            at = self._stat_at.get((info.name, pattern))
            if at is None:
                self._stat_at[(info.name, pattern)] = len(self._stats)
                self._stats.append(PatternStat(info.name, info.kind, pattern, m, e))
            else:
                old = self._stats[at]
                self._stats[at] = replace(
                    old, matched_times=old.matched_times + m, effected_times=old.effected_times + e
                )
        self._next_index[info.name] = self._index
        self.current = None

    def allow(self, pattern: str, nodes: Iterable[str]) -> bool:
        """Count a match of ``pattern`` over ``nodes`` (original node names); True: apply it."""
        assert self.current is not None, "allow() outside a pass"
        names = tuple(dict.fromkeys(nodes))
        if (pattern, names) in self._denied_before:
            return False  # denied in an earlier run of this pass: the same application again
        index = self._index
        self._index += 1
        ok = index not in self.deny.get(self.current.name, frozenset())
        counts = self._counts.setdefault(pattern, [0, 0])
        counts[0] += 1
        counts[1] += int(ok)
        self._apps.append(Application(self.current.name, index, pattern, names, ok))
        if not ok:
            self._denied.setdefault(self.current.name, set()).add((pattern, names))
        return ok

    def split(self, point: str) -> int:
        """The value of one of the current pass's split points (0: no cut)."""
        assert self.current is not None
        return self.config.split_value(self.current.name, point)

    def report(self) -> FusionReport:
        return FusionReport(tuple(self._stats), tuple(self._apps), tuple(dict.fromkeys(s.pass_name for s in self._stats)))
