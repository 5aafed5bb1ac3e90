"""Accuracy bisection: which pass, and then which single fusion, breaks the accuracy bound.

Seed 003's manual loop (switch a fusion off in ``fusion_switch.cfg``, rerun, compare) as a tool.
Input: a configuration that breaks the bound (``bad``) and one that holds it (``good``).

Step 1 runs delta debugging over the *changes* between the two: the passes whose switch differs
and the split points whose value differs. A test applies a subset of the changes to ``good`` and
asks the evaluator for the error; it fails when the error is above the bound. :func:`minimize`
returns a 1-minimal failing subset: the culprits (one pass, or an interacting set where every
member is needed).

Step 2 runs the same search inside each culprit pass over its *applications* (one fusion each,
``PassContext.allow``): the other applications are denied through ``EvalRequest.deny``, so the
culprit is named down to the original graph's node names.

If switching the culprits off does not bring ``bad`` within the bound (a second, independent
culprit), the bisection starts again from that configuration, until the safe configuration holds.

This module speaks to the evaluator protocol only (``evaluate(requests) -> results``): it works
with the local, Ray, replay and command evaluators alike and never imports numba. The command
(a search space and typed options in, the culprits printed) is :mod:`fusiontune.bisect.driver`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fusiontune.config.flags import render_flags
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.switch_file import dump_switch_json
from fusiontune.errors import UserError
from fusiontune.passes.registry import BY_NAME
from fusiontune.tune.records import EvalRequest, EvalResult, normalize_deny

T = TypeVar("T", bound=Hashable)

FAIL = "FAIL"
PASS = "pass"
UNRESOLVED = "unresolved"


class BisectError(UserError):
    """The endpoints do not bracket the bound (bad holds it, or good breaks it)."""


# ---- delta debugging ----------------------------------------------------------------------------


def minimize(items: Sequence[T], fails: Callable[[tuple[T, ...]], bool]) -> tuple[T, ...]:
    """A 1-minimal subset of ``items`` on which ``fails`` is True.

    Preconditions (checked by the caller): ``fails(items)`` is True and ``fails(())`` is False.
    ``fails`` should be memoized: the search may ask for the same subset twice.

    First an optimistic bisection, which assumes a single culprit: split the current set in
    two; if the first half fails, keep it, else take the second half *without testing it* (with a
    single culprit it must fail). The one element it ends on is then tested; a single culprit
    costs at most ``ceil(log2 n) + 1`` tests. When the assumption was wrong (the culprits
    interact), the culprits are found one at a time from the smallest subset seen to fail, each
    by a binary search for the shortest failing prefix (``log2 n`` tests per culprit). The result
    is then checked to be 1-minimal (removing any one element makes the failure go away); when it
    is not (failing is not monotone in the set), Zeller's ddmin finishes from it.

    Returns:
        The culprits, in the order of ``items``.
    """
    confirmed: tuple[T, ...] = tuple(items)
    candidate = confirmed
    while len(candidate) > 1:
        half = len(candidate) // 2
        first, second = candidate[:half], candidate[half:]
        if fails(first):
            confirmed = candidate = first
        else:
            candidate = second
    if candidate != confirmed and fails(candidate):
        confirmed = candidate
    if len(confirmed) == 1:
        return confirmed
    found = _prefix_reduce(confirmed, fails)
    for x in found:  # 1-minimal? (always, when failing is monotone in the set)
        if fails(tuple(y for y in found if y != x)):
            return _ddmin(found, fails)
    return found


def _prefix_reduce(items: tuple[T, ...], fails: Callable[[tuple[T, ...]], bool]) -> tuple[T, ...]:
    """Culprits one at a time, each by a binary search for the shortest failing prefix.

    With the culprits found so far always included, the shortest prefix of the rest that fails
    ends in a culprit: ``log2 n`` tests per culprit, where ddmin needs many more for a pair.
    Assumes failing is monotone (a superset of a failing set fails); the caller checks the result.
    """
    order = {x: i for i, x in enumerate(items)}
    found: list[T] = []
    pool = list(items)

    def with_found(prefix: list[T]) -> tuple[T, ...]:
        return tuple(sorted([*found, *prefix], key=order.__getitem__))

    while pool and not (found and fails(with_found([]))):
        lo, hi = 0, len(pool)  # fails(found + pool[:hi]) holds; fails(found + pool[:lo]) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(with_found(pool[:mid])):
                hi = mid
            else:
                lo = mid
        found.append(pool[hi - 1])
        pool = pool[: hi - 1]
    return with_found([])


def _ddmin(items: tuple[T, ...], fails: Callable[[tuple[T, ...]], bool]) -> tuple[T, ...]:
    """Zeller and Hildebrandt's ddmin (2002): reduce to subsets, then to complements, then refine."""
    current = items
    n = 2
    while len(current) >= 2:
        chunks = _split(current, n)
        reduced = False
        for chunk in chunks:
            if fails(chunk):
                current, n, reduced = chunk, 2, True
                break
        if not reduced and n > 2:
            for chunk in chunks:
                rest = tuple(x for x in current if x not in chunk)
                if fails(rest):
                    current, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return current


def _split(items: tuple[T, ...], n: int) -> list[tuple[T, ...]]:
    out, start = [], 0
    for i in range(n):
        stop = start + (len(items) - start) // (n - i)
        out.append(items[start:stop])
        start = stop
    return [c for c in out if c]


# ---- the changes between two configurations ---------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One difference between the good and the bad configuration.

    Attributes:
        name: a pass name, or ``"Pass.point"`` for a split point.
        good: its value in the good configuration (on/off, or the split value).
        bad: its value in the bad configuration.
    """

    name: str
    good: int
    bad: int

    @property
    def is_pass(self) -> bool:
        # Split points are "Pass.point"; pass names (the registry's, or a job's) have no dot.
        return "." not in self.name

    def describe(self) -> str:
        if self.is_pass:
            return self.name
        return f"{self.name}={self.bad}"


def changes_between(good: FusionConfig, bad: FusionConfig) -> list[Change]:
    """Passes whose switch differs, then split points whose value differs, in table order."""
    out = [Change(p, int(good.switches[p]), int(bad.switches[p])) for p in good.switches if good.switches[p] != bad.switches[p]]
    out += [
        Change(k, good.split_points[k], bad.split_points[k])
        for k in good.split_points
        if good.split_points[k] != bad.split_points[k]
    ]
    order = {p.name: i for i, p in enumerate(good.pass_rows())}  # the registry's, or the job's
    return sorted(out, key=lambda c: (not c.is_pass, order.get(c.name.split(".")[0], 0), c.name))


def apply_changes(base: FusionConfig, changes: Iterable[Change], to_bad: bool = True) -> FusionConfig:
    """``base`` with each change set to its bad value (``to_bad``) or its good value."""
    switches = dict(base.switches)
    points = dict(base.split_points)
    for c in changes:
        value = c.bad if to_bad else c.good
        if c.is_pass:
            switches[c.name] = bool(value)
        else:
            points[c.name] = value
    return base.with_values(switches, points)  # over base's table: the registry or a job's


# ---- evaluations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """One evaluation the bisection asked for, as printed and written to ``bisect.json``."""

    index: int
    step: str  # endpoints | passes | applications | safe
    label: str
    config_key: str
    deny: tuple[tuple[str, tuple[int, ...]], ...]
    error: float
    verdict: str
    result: EvalResult

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "step": self.step,
            "label": self.label,
            "config_key": self.config_key,
            "deny": {p: list(idx) for p, idx in self.deny},
            "error": _num(self.error),
            "verdict": self.verdict,
            "result": self.result.to_json(),
        }


class Oracle:
    """Asks the evaluator, one request at a time, and remembers every answer.

    Each distinct (configuration, denied applications) is evaluated once; a repeated question is
    answered from memory and does not count as an evaluation.
    """

    def __init__(self, evaluator: Any, metric: str, bound: float, log: Callable[[str], None] = print) -> None:
        self.evaluator = evaluator
        self.metric = metric
        self.bound = bound
        self.log = log
        self.evaluations: list[Evaluation] = []
        self._memo: dict[str, Evaluation] = {}

    def verdict(self, result: EvalResult) -> tuple[float, str]:
        if not result.ok:
            return math.nan, UNRESOLVED
        error = result.error(self.metric)
        return error, FAIL if not error <= self.bound else PASS

    def ask(
        self,
        config: FusionConfig,
        label: str,
        step: str,
        deny: Mapping[str, Iterable[int]] | None = None,
    ) -> Evaluation:
        request = EvalRequest(len(self.evaluations), config, normalize_deny(deny), timing=False, applications=True)
        held = self._memo.get(request.key())
        if held is not None:
            return held
        (result,) = self.evaluator.evaluate([request])
        error, verdict = self.verdict(result)
        ev = Evaluation(len(self.evaluations) + 1, step, label, config.key(), request.deny, error, verdict, result)
        self.evaluations.append(ev)
        self._memo[request.key()] = ev
        shown = f"{self.metric}={error:.3g}" if result.ok else f"failed: {result.error_msg}"
        self.log(f"[{ev.index:3d}] {step:<12} {label:<60} {shown:<22} {verdict}")
        return ev

    def fails(self, config: FusionConfig, label: str, step: str, deny: Mapping[str, Iterable[int]] | None = None) -> bool:
        """True when the error breaks the bound; an evaluation that failed counts as not failing
        (ddmin's "unresolved": it says nothing about accuracy)."""
        return self.ask(config, label, step, deny).verdict == FAIL


# ---- the bisection ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Culprit:
    """A culprit pass (or split point) and its culprit applications (fusions)."""

    name: str
    applications: tuple[tuple[int, tuple[str, ...]], ...]
    total_applications: int
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pass": self.name,
            "applications": [{"index": i, "nodes": list(nodes)} for i, nodes in self.applications],
            "total_applications": self.total_applications,
        }
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class BisectResult:
    """What a bisection found, and what it cost."""

    metric: str
    bound: float
    bad: FusionConfig
    good: FusionConfig
    bad_error: float
    good_error: float
    culprits: list[Culprit] = field(default_factory=list)
    culprit_sets: list[list[str]] = field(default_factory=list)
    safe_config: FusionConfig | None = None
    safe_error: float = math.nan
    evaluations: list[Evaluation] = field(default_factory=list)
    linear_scan_evaluations: int = 0
    status: str = "done"

    @property
    def holds(self) -> bool:
        return self.status == "done" and self.safe_error <= self.bound

    def to_json(self, workload: str = "") -> dict[str, Any]:
        return {
            "workload": workload,
            "metric": self.metric,
            "bound": self.bound,
            "status": self.status,
            "culprits": [c.to_json() for c in self.culprits],
            "culprit_sets": self.culprit_sets,
            "evaluations": [e.to_json() for e in self.evaluations],
            "evaluation_count": len(self.evaluations),
            "linear_scan_evaluations": self.linear_scan_evaluations,
            "bad_error": _num(self.bad_error),
            "good_error": _num(self.good_error),
            "safe_error": _num(self.safe_error),
            "bad_config": self.bad.to_json(),
            "good_config": self.good.to_json(),
            "safe_config": self.safe_config.to_json() if self.safe_config is not None else None,
        }


def bisect(
    evaluator: Any,
    bad: FusionConfig,
    good: FusionConfig,
    bound: float,
    metric: str = "max_rel",
    log: Callable[[str], None] = print,
    result: BisectResult | None = None,
) -> BisectResult:
    """Find the culprit passes, then the culprit fusions, between ``bad`` and ``good``.

    Args:
        evaluator: any evaluator (``evaluate(requests) -> results``); it is asked for accuracy
            only (``timing=False``) and for the applications each pass made.
        bad: a configuration whose error breaks the bound.
        good: a configuration whose error holds it.
        bound: the largest acceptable error.
        metric: the error metric (max_abs, max_rel, rel_l2, cosine).
        log: receives one line per evaluation, as it happens.
        result: filled in as the search goes, so that a caller who is interrupted keeps the
            evaluations made so far (pass an empty one).

    Raises:
        BisectError: ``bad`` holds the bound or ``good`` breaks it (or either cannot be evaluated).
    """
    oracle = Oracle(evaluator, metric, bound, log)
    res = result if result is not None else BisectResult(metric, bound, bad, good, math.nan, math.nan)
    res.metric, res.bound, res.bad, res.good = metric, bound, bad, good
    res.evaluations = oracle.evaluations
    res.status = "running"
    b = oracle.ask(bad, "bad (the configuration that loses accuracy)", "endpoints")
    g = oracle.ask(good, "good (the configuration that holds the bound)", "endpoints")
    res.bad_error, res.good_error = b.error, g.error
    for ev, name in ((b, "bad"), (g, "good")):
        if ev.verdict == UNRESOLVED:
            raise BisectError(f"the {name} configuration could not be evaluated: {ev.result.error_msg}")
    if b.verdict != FAIL:
        raise BisectError(
            f"the bad configuration holds the bound ({metric}={b.error:.3g} <= {bound:g}): nothing to bisect;"
            " pass --bad with a configuration that loses accuracy, or a tighter --bound"
        )
    if g.verdict == FAIL:
        raise BisectError(
            f"the good configuration breaks the bound too ({metric}={g.error:.3g} > {bound:g}): no configuration"
            " between them can be blamed; pass --good with one that holds it, or a looser --bound"
        )
    current = bad
    all_changes = changes_between(good, bad)
    res.linear_scan_evaluations = len(all_changes)
    for _round in range(len(all_changes)):
        changes = changes_between(good, current)
        culprit_changes = _step_passes(oracle, good, changes)
        res.culprit_sets.append([c.name for c in culprit_changes])
        failing = apply_changes(good, culprit_changes)
        for change in culprit_changes:
            culprit = _step_applications(oracle, failing, change)
            res.culprits.append(culprit)
            res.linear_scan_evaluations += culprit.total_applications
        current = apply_changes(current, culprit_changes, to_bad=False)
        names = ", ".join(c.describe() for c in culprit_changes)
        safe = oracle.ask(current, "bad without " + _names([c.describe() for c in culprit_changes]), "safe")
        res.safe_config, res.safe_error = current, safe.error
        if safe.verdict != FAIL:
            break
        log(f"switching off {names} is not enough ({metric}={safe.error:.3g}): bisecting again from there")
    res.status = "done"
    return res


def _step_passes(oracle: Oracle, good: FusionConfig, changes: list[Change]) -> tuple[Change, ...]:
    """Step 1: a 1-minimal set of changes that, applied to ``good``, breaks the bound."""

    def fails(subset: tuple[Change, ...]) -> bool:
        if not subset:
            return False  # good itself, evaluated first (every other subset: asked, or remembered)
        return oracle.fails(apply_changes(good, subset), _label_changes(subset, changes), "passes")

    return minimize(tuple(changes), fails)


def _step_applications(oracle: Oracle, failing: FusionConfig, change: Change) -> Culprit:
    """Step 2: inside one culprit pass, a 1-minimal set of its applications that breaks the bound."""
    if not change.is_pass:
        return Culprit(change.name, (), 0, f"split point: {change.bad} in the bad configuration, {change.good} in the good one")
    if not change.bad:
        return Culprit(change.name, (), 0, "switched off in the bad configuration: no applications to search")
    ev = oracle.ask(failing, f"culprits on, every application of {change.name}"[:60], "applications")
    applications = ev.result.fusion.applications
    apps = {a.index: a.nodes for a in applications if a.pass_name == change.name and a.applied}
    if not applications:
        return Culprit(change.name, (), 0, "this evaluator does not report applications: step 2 skipped")
    if not apps:
        return Culprit(change.name, (), 0, f"{change.name} made no application in the failing configuration")
    indices = tuple(sorted(apps))
    if len(indices) == 1:
        return Culprit(change.name, ((indices[0], apps[indices[0]]),), 1)

    def fails(subset: tuple[int, ...]) -> bool:
        if not subset:
            return False
        deny = {change.name: [i for i in indices if i not in subset]}
        label = f"{change.name} only at {_label_indices(subset)} of {len(indices)}"
        return oracle.fails(failing, label[:60], "applications", deny)

    found = minimize(indices, fails)
    return Culprit(change.name, tuple((i, apps[i]) for i in found), len(indices))


def _label_changes(subset: Sequence[Change], changes: Sequence[Change]) -> str:
    if len(subset) == len(changes):
        return "bad (every change)"
    if len(subset) <= len(changes) - len(subset):
        return "good + " + _names([c.describe() for c in subset])
    return "bad - " + _names([c.describe() for c in changes if c not in subset])


def _names(names: Sequence[str], width: int = 52) -> str:
    """``A, B, C`` or, when that is too long, ``A, B (+3 more)``."""
    text = ", ".join(names)
    if len(text) <= width:
        return text
    shown: list[str] = []
    for n in names:
        if len(", ".join([*shown, n])) > width - 12:
            break
        shown.append(n)
    shown = shown or [names[0]]
    return ", ".join(shown) + f" (+{len(names) - len(shown)} more)"


def _label_indices(indices: Sequence[int]) -> str:
    if len(indices) > 4:
        return f"{{{indices[0]}..{indices[-1]}}} ({len(indices)})"
    return "{" + ", ".join(map(str, indices)) + "}"


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


# ---- outputs ------------------------------------------------------------------------------------


def write_outputs(result: BisectResult, out_dir: str | Path, workload: str = "") -> list[Path]:
    """``bisect.json``, ``bisect.md`` and (when found) ``safe_fusion_switch.cfg`` in ``out_dir``.

    For a command target's job, ``safe_graph_kernel_flags.txt`` too (the same for MindSpore).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bisect.json", out / "bisect.md"]
    paths[0].write_text(json.dumps(result.to_json(workload), indent=2) + "\n")
    paths[1].write_text(render_markdown(result, workload))
    if result.safe_config is not None:
        cfg = out / "safe_fusion_switch.cfg"
        cfg.write_text(dump_switch_json(result.safe_config))
        paths.append(cfg)
        if result.safe_config.is_job:  # a MindSpore job reads flags, not a cfg
            flags = out / "safe_graph_kernel_flags.txt"
            flags.write_text(render_flags(result.safe_config) + "\n")
            paths.append(flags)
        if any(result.safe_config.split_points.values()):
            sidecar = out / "safe_best_config.json"
            sidecar.write_text(json.dumps(result.safe_config.to_json(), indent=2) + "\n")
            paths.append(sidecar)
    return paths


def render_markdown(result: BisectResult, workload: str = "") -> str:
    """``bisect.md``: the culprits, the fusions by node name, the errors, the cost."""
    m = result.metric
    lines = [f"# Accuracy bisection{': ' + workload if workload else ''}", ""]
    if result.status != "done":
        lines += [f"**Status: {result.status}** (the evaluations below are what was done).", ""]
    lines += [
        f"- bound: {m} <= {result.bound:g}",
        f"- bad configuration: {m} = {format_error(result.bad_error)}",
        f"- good configuration: {m} = {format_error(result.good_error)}",
        f"- safe configuration (bad with the culprits off): {m} = {format_error(result.safe_error)}"
        + (" (holds the bound)" if result.holds else " (does NOT hold the bound)" if result.safe_config else ""),
        f"- evaluations: {len(result.evaluations)} (switching passes off one by one, then single fusions,"
        f" would have taken {result.linear_scan_evaluations})",
        "",
        "## Culprits",
        "",
    ]
    if not result.culprits:
        lines.append("none found")
    for c in result.culprits:
        info = None if result.bad.is_job else BY_NAME.get(c.name)  # a job's pass is the job's
        exact = "" if info is None else (" (exact pass)" if info.exact else f" (inexact: expected error {info.expected_error:g})")
        lines.append(f"### {c.name}{exact}")
        lines.append("")
        if c.note:
            lines.append(c.note)
        for i, nodes in c.applications:
            lines.append(f"- application {i} of {c.total_applications}: {', '.join(nodes)}")
        lines.append("")
    lines += ["## Evaluations", "", f"| # | step | configuration | {m} | verdict |", "|---|---|---|---|---|"]
    for e in result.evaluations:
        lines.append(f"| {e.index} | {e.step} | {e.label} | {format_error(e.error)} | {e.verdict} |")
    lines.append("")
    if result.safe_config is not None:
        lines += ["Use `safe_fusion_switch.cfg` (the bad configuration with only the culprits switched off).", ""]
    return "\n".join(lines)


def format_error(x: float) -> str:
    """An error for a table or a line: three significant digits, ``n/a`` when not measured."""
    return "n/a" if x is None or math.isnan(x) else f"{x:.3g}"


def default_bad() -> FusionConfig:
    """The registry defaults with every inexact pass on: what a user who turns on the speed-for-accuracy
    trades (FastGelu, approximate math, one-pass variance, low precision) would run."""
    inexact = {p.name: True for p in BY_NAME.values() if not p.exact and p.switchable}
    return FusionConfig.defaults().with_switches(**inexact)
