"""Bisection logic against synthetic evaluators: no compiler, exact counts of evaluations."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusiontune.bisect import (
    FAIL,
    BisectError,
    BisectResult,
    bisect,
    changes_between,
    default_bad,
    minimize,
    write_outputs,
)
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.switch_file import load_config
from fusiontune.measure import ErrorMetrics
from fusiontune.passes.base import Application, FusionReport
from fusiontune.passes.registry import PASSES
from fusiontune.tune.records import OK, EvalRequest, EvalResult
from fusiontune.tune.replay import ReplayEvaluator

GOOD = FusionConfig.all_off()
ALL_ON = FusionConfig.resolve(all_switch={"GraphFusion": True, "UBFusion": True})
BOUND = 1e-4


class Synthetic:
    """An evaluator whose error is a rule over the configuration and the denied applications.

    Every switched-on pass makes ``apps`` applications named ``<pass>/n<i>``; ``broken(config,
    deny)`` says whether the error is large.
    """

    def __init__(self, broken: Callable[[FusionConfig, dict[str, frozenset[int]]], bool], apps: int = 3) -> None:
        self.broken = broken
        self.apps = apps
        self.requests: list[EvalRequest] = []

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        out = []
        for r in requests:
            self.requests.append(r)
            deny = r.deny_map()
            error = 1e-2 if self.broken(r.config, deny) else 1e-6
            applications = tuple(
                Application(p, i, "P", (f"{p}/n{i}",), i not in deny.get(p, frozenset()))
                for p, on in r.config.switches.items()
                if on
                for i in range(self.apps)
            )
            errors = ErrorMetrics(error, error, error, error, True)
            fusion = FusionReport((), applications, ())
            out.append(EvalResult(r.trial, r.key(), "h", OK, errors=errors, fusion=fusion))
        return out

    def close(self) -> None:
        pass


def _quiet(_line: str) -> None:
    pass


def _switchable_diff() -> list[str]:
    return [c.name for c in changes_between(GOOD, ALL_ON)]


def test_the_default_bad_configuration_turns_every_inexact_pass_on() -> None:
    bad = default_bad()
    inexact = [p.name for p in PASSES if not p.exact]
    assert inexact, "the registry has inexact passes"
    assert all(bad.enabled(p) for p in inexact)
    assert all(bad.enabled(p.name) == p.default for p in PASSES if p.exact)


@pytest.mark.parametrize("culprit", _switchable_diff())
def test_a_single_planted_culprit_is_found_in_log2_n_plus_3_evaluations(culprit: str) -> None:
    n = len(_switchable_diff())
    assert n >= 16
    ev = Synthetic(lambda c, d: c.enabled(culprit), apps=1)
    res = bisect(ev, ALL_ON, GOOD, BOUND, log=_quiet)
    assert [c.name for c in res.culprits] == [culprit]
    assert res.culprit_sets == [[culprit]]
    finding = [e for e in res.evaluations if e.step != "safe"]
    assert len(finding) <= math.ceil(math.log2(n)) + 3, [e.label for e in finding]
    assert res.holds and res.safe_config == ALL_ON.with_switches(**{culprit: False})
    assert res.linear_scan_evaluations == n + 1
    assert res.linear_scan_evaluations > len(res.evaluations)


@pytest.mark.parametrize("pair", [(0, 1), (0, -1), (3, 17), (9, 10)])
def test_an_interacting_pair_is_found(pair: tuple[int, int]) -> None:
    names = _switchable_diff()
    a, b = names[pair[0]], names[pair[1]]
    ev = Synthetic(lambda c, d: c.enabled(a) and c.enabled(b), apps=1)
    res = bisect(ev, ALL_ON, GOOD, BOUND, log=_quiet)
    assert sorted(c.name for c in res.culprits) == sorted([a, b])
    assert res.holds
    # Optimistic bisection, then two prefix searches, the 1-minimality check, endpoints and safe:
    # 21 at most over every pair of the 24 (ddmin alone took 34 for some).
    n = len(names)
    assert len(res.evaluations) <= 3 * math.ceil(math.log2(n)) + 6
    # Switching either one off is enough: the safe configuration holds.
    assert not (res.safe_config.enabled(a) or res.safe_config.enabled(b))


def test_a_culprit_pass_with_12_applications_is_localized_to_its_bad_application() -> None:
    culprit = "TbeEltwiseFusionPass"
    ev = Synthetic(lambda c, d: c.enabled(culprit) and 7 not in d.get(culprit, frozenset()), apps=12)
    res = bisect(ev, ALL_ON, GOOD, BOUND, log=_quiet)
    (found,) = res.culprits
    assert found.name == culprit
    assert found.applications == ((7, (f"{culprit}/n7",)),)
    assert found.total_applications == 12
    steps = [e for e in res.evaluations if e.step == "applications"]
    assert len(steps) <= math.ceil(math.log2(12)) + 1
    # Every evaluation of step 2 kept the culprit pass on and denied some of its applications.
    assert all(e.deny and e.deny[0][0] == culprit for e in steps)


def test_two_bad_applications_that_interact_are_both_named() -> None:
    culprit = "CompositeOpsFusionPass"

    def broken(c: FusionConfig, d: dict[str, frozenset[int]]) -> bool:
        denied = d.get(culprit, frozenset())
        return c.enabled(culprit) and 2 not in denied and 9 not in denied

    res = bisect(Synthetic(broken, apps=12), ALL_ON, GOOD, BOUND, log=_quiet)
    assert [i for i, _ in res.culprits[0].applications] == [2, 9]


def test_independent_culprits_are_found_one_after_the_other() -> None:
    a, b = "GeluFusionPass", "TbeMultiOutputFusionPass"
    ev = Synthetic(lambda c, d: c.enabled(a) or c.enabled(b), apps=1)
    lines: list[str] = []
    res = bisect(ev, ALL_ON, GOOD, BOUND, log=lines.append)
    assert sorted(c.name for c in res.culprits) == sorted([a, b])
    assert len(res.culprit_sets) == 2
    assert res.holds
    assert any("bisecting again" in line for line in lines)


def test_each_evaluation_is_printed_with_configuration_error_and_verdict() -> None:
    lines: list[str] = []
    res = bisect(Synthetic(lambda c, d: c.enabled("GeluFusionPass")), ALL_ON, GOOD, BOUND, log=lines.append)
    assert len(lines) == len(res.evaluations)
    assert "bad" in lines[0] and "max_rel=0.01" in lines[0] and lines[0].endswith(FAIL)
    assert lines[1].endswith("pass")


def test_endpoints_that_do_not_bracket_the_bound_are_refused() -> None:
    with pytest.raises(BisectError, match="bad configuration holds the bound"):
        bisect(Synthetic(lambda c, d: False), ALL_ON, GOOD, BOUND, log=_quiet)
    with pytest.raises(BisectError, match="good configuration breaks the bound too"):
        bisect(Synthetic(lambda c, d: True), ALL_ON, GOOD, BOUND, log=_quiet)


def test_a_failed_evaluation_is_unresolved_not_a_culprit() -> None:
    culprit, crashes = "SoftmaxFusionPass", "SwiGluFusionPass"

    class Crashing(Synthetic):
        def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
            out = super().evaluate(requests)
            return [
                EvalResult.failure(r.trial, r.config, "kernel failed to compile")
                if r.config.enabled(crashes) and not r.config.enabled(culprit) else res
                for r, res in zip(requests, out, strict=True)
            ]

    res = bisect(Crashing(lambda c, d: c.enabled(culprit)), ALL_ON, GOOD, BOUND, log=_quiet)
    assert [c.name for c in res.culprits] == [culprit]


def test_outputs_are_written_and_replay_reproduces_the_bisection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    culprit = "TbeEltwiseFusionPass"
    ev = Synthetic(lambda c, d: c.enabled(culprit) and 4 not in d.get(culprit, frozenset()), apps=6)
    res = bisect(ev, ALL_ON, GOOD, BOUND, log=_quiet)
    paths = write_outputs(res, tmp_path, "synthetic")
    assert {p.name for p in paths} == {"bisect.json", "bisect.md", "safe_fusion_switch.cfg"}
    data = json.loads((tmp_path / "bisect.json").read_text())
    assert data["culprits"] == [
        {"pass": culprit, "applications": [{"index": 4, "nodes": [f"{culprit}/n4"]}], "total_applications": 6}
    ]
    for key in ("evaluations", "linear_scan_evaluations", "bad_error", "safe_error", "safe_config"):
        assert key in data
    assert data["bad_error"] == pytest.approx(1e-2) and data["safe_error"] == pytest.approx(1e-6)
    safe = load_config(tmp_path / "safe_fusion_switch.cfg")
    assert safe == ALL_ON.with_switches(**{culprit: False})
    assert culprit in (tmp_path / "bisect.md").read_text()

    replay = ReplayEvaluator.from_bisect(str(tmp_path / "bisect.json"))
    again = bisect(replay, ALL_ON, GOOD, BOUND, log=_quiet)
    assert [c.to_json() for c in again.culprits] == data["culprits"]
    assert len(again.evaluations) == len(res.evaluations)


def test_split_point_differences_are_changes_too() -> None:
    bad = ALL_ON.with_splits(**{"MatMulRowSplitFusionPass.row_block": 128})
    point = "MatMulRowSplitFusionPass.row_block"
    ev = Synthetic(lambda c, d: c.split_points[point] == 128)
    res = bisect(ev, bad, GOOD, BOUND, log=_quiet)
    # row_block needs its pass on to exist as a change, but the rule here looks at the value only.
    assert [c.name for c in res.culprits] == [point]
    assert res.safe_config is not None and res.safe_config.split_points[point] == 0


@given(
    n=st.integers(2, 40),
    culprits=st.lists(st.lists(st.integers(0, 39), min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_minimize_returns_a_1_minimal_failing_subset(n: int, culprits: list[list[int]]) -> None:
    sets = [frozenset(x % n for x in c) for c in culprits]
    calls: dict[tuple[int, ...], bool] = {}

    def fails(subset: tuple[int, ...]) -> bool:
        if subset not in calls:
            calls[subset] = any(s <= set(subset) for s in sets)
        return calls[subset]

    found = minimize(tuple(range(n)), fails)
    assert fails(found)
    for x in found:
        assert not fails(tuple(y for y in found if y != x))


def test_result_survives_an_interruption_with_its_evaluations() -> None:
    culprit = "GeluFusionPass"

    class Interrupting(Synthetic):
        def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
            if len(self.requests) >= 4:
                raise KeyboardInterrupt
            return super().evaluate(requests)

    result = BisectResult("max_rel", BOUND, ALL_ON, GOOD, math.nan, math.nan)
    with pytest.raises(KeyboardInterrupt):
        bisect(Interrupting(lambda c, d: c.enabled(culprit)), ALL_ON, GOOD, BOUND, log=_quiet, result=result)
    assert len(result.evaluations) == 4


def test_the_bisection_logic_never_imports_numba() -> None:
    import subprocess
    import sys

    code = "import sys, fusiontune.bisect; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
