"""The pipeline: canonicalize -> GraphFusion -> [backward] -> split -> UBFusion grouping -> split -> precision.

The first stage, canonicalize, brings the graph to one normal form for the GraphFusion patterns:
constant folding, identity elimination and the canonicalization rules (all exact, none
switchable), repeated as a whole until a round changes nothing (at most
``MAX_CANONICALIZE_ROUNDS`` rounds; a rule set that does not reach a fixed point is a bug and
raises). The last stage, precision, holds the inexact UBFusion passes that change how a formed
kernel computes (approximate transcendentals, low-precision intermediates), not which nodes it
holds.

Each stage runs the registry's passes of that stage in table order, the enabled ones only, and
every pass that runs leaves its CANN log lines in the report, in execution order:
``GraphFusionPass[SoftmaxFusionPass]: pattern=Softmax, matched_times=2, effected_times=2``.
A pass that runs in several canonicalize rounds has one line per pattern, with the totals over
the rounds, and its application indices run on across the rounds (unique per pass, stable for a
given graph and configuration).

A training step (``train`` given) adds the ``backward`` stage after GraphFusion: ``AutodiffPass``
writes the loss, the backward of the fused forward and the optimizer update
(:mod:`fusiontune.ir.training`), ``GradExpanderPass`` expands the backward ops whose switch is off,
and the backward fusion passes (``SoftmaxGradFusionPass``...) keep the others as single ops reading
the forward's saved statistics. Then the canonicalize stage runs again over the whole step, so the
UBFusion passes group forward and backward kernels alike. Without ``train`` the stage does not run
and leaves no log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.graph import Graph
from fusiontune.ir.training import TrainSpec
from fusiontune.passes.base import GRAPH_FUSION, FusionReport, PassContext, PassInfo
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.registry import PASSES, STAGES

log = logging.getLogger("fusiontune.passes")

CANONICALIZE = "canonicalize"
BACKWARD = "backward"
MAX_CANONICALIZE_ROUNDS = 16
"""Rounds of the canonicalize stage after which its rules count as not terminating."""


@dataclass(frozen=True)
class PipelineResult:
    """The fused program's graph and groups, the report, and a snapshot after every stage."""

    fused: FusedGraph
    report: FusionReport
    stages: tuple[tuple[str, FusedGraph], ...]


def run_pipeline(
    graph: Graph,
    config: FusionConfig,
    deny: Mapping[str, frozenset[int]] | None = None,
    on_stage: Callable[[str, FusedGraph], None] | None = None,
    train: TrainSpec | None = None,
) -> PipelineResult:
    """Rewrite ``graph`` with the passes ``config`` enables.

    Args:
        graph: the unfused graph.
        config: the resolved configuration.
        deny: applications to refuse, by pass name and application index (bisection).
        on_stage: called with each stage's name and result (graph dumps).
        train: make ``graph`` (a forward whose parameters are inputs) a training step.

    Returns:
        The fused graph, the fusion report, and a snapshot after each stage.
    """
    ctx = PassContext(config=config, deny=dict(deny or {}), train=train)
    current = graph
    fused: FusedGraph | None = None
    snapshots: list[tuple[str, FusedGraph]] = [("input", FusedGraph.singletons(graph))]
    for stage in STAGES:
        infos = [p for p in PASSES if p.stage == stage and config.enabled(p.name)]
        if stage == BACKWARD and train is None:
            continue
        if stage == CANONICALIZE:
            current = _canonicalize(current, infos, ctx)
        else:
            for info in infos:
                fn = info.load()
                ctx.begin(info)
                if info.kind == GRAPH_FUSION:
                    assert fused is None, "GraphFusion passes run before grouping"
                    current = fn(current, ctx)
                else:
                    if fused is None:
                        fused = FusedGraph.singletons(current)
                    fused = fn(fused, ctx)
                ctx.end(getattr(fn, "patterns", ()))
        if stage == BACKWARD:
            canonical = [p for p in PASSES if p.stage == CANONICALIZE and config.enabled(p.name)]
            current = _canonicalize(current, canonical, ctx)
        snap = fused if fused is not None else FusedGraph.singletons(current)
        snapshots.append((stage, snap))
        if on_stage is not None:
            on_stage(stage, snap)
    final = fused if fused is not None else FusedGraph.singletons(current)
    report = ctx.report()
    for line in report.log_lines():
        log.info(line)
    return PipelineResult(final, report, tuple(snapshots))


def _canonicalize(graph: Graph, infos: Sequence[PassInfo], ctx: PassContext) -> Graph:
    """Run the canonicalize stage's passes, in order, until a whole round changes nothing.

    Raises:
        RuntimeError: no fixed point after ``MAX_CANONICALIZE_ROUNDS`` rounds.
    """
    changed: list[str] = []
    for _ in range(MAX_CANONICALIZE_ROUNDS):
        changed = []
        for info in infos:
            assert info.kind == GRAPH_FUSION, f"{info.name}: the canonicalize stage rewrites graphs"
            fn = info.load()
            ctx.begin(info)
            rewritten = fn(graph, ctx)
            ctx.end(getattr(fn, "patterns", ()))
            if rewritten is not graph:
                changed.append(info.name)
                graph = rewritten
        if not changed:
            return graph
    raise RuntimeError(
        f"{graph.name}: the canonicalize stage reached no fixed point in {MAX_CANONICALIZE_ROUNDS}"
        f" rounds ({', '.join(changed)} still rewrote the graph): its rules do not terminate"
    )


F = TypeVar("F", bound=Callable[..., object])


def patterns(*names: str) -> Callable[[F], F]:
    """Declare the pattern names a pass tries, so the log shows them even with 0 matches."""

    def mark(fn: F) -> F:
        fn.patterns = names  # type: ignore[attr-defined]
        return fn

    return mark
