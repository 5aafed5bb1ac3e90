"""Confirmation: interleaved re-measurement, the CI of the median, and who is named the winner."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.tune.confirm import (
    Candidate,
    ConfirmedRow,
    confirm,
    decide,
    measure_interleaved,
    median_ci,
    model_order,
    select_candidates,
)
from fusiontune.tune.evaluator import LocalEvaluator
from fusiontune.tune.store import Confirmation, StudyStore
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import load_space

SPACE = (
    (Path(__file__).resolve().parents[1] / "data" / "tiny_space.toml").read_text()
    + """\
[search]
sampler = "random"
seed = 0
top_k = 3
workers = 0
"""
)


# ---- the interval --------------------------------------------------------------------------------
def test_median_ci_of_15_samples_is_the_4th_to_12th_order_statistic():
    samples = np.random.default_rng(0).permutation(np.arange(1.0, 16.0))
    assert median_ci(samples) == (4.0, 12.0)  # coverage 1 - 2 P(Bin(15, 1/2) <= 3) = 96.5%


def test_median_ci_of_few_samples_is_the_range():
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_median_ci_covers_the_median_at_least_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(2000):
        low, high = median_ci(rng.exponential(size=21))
        hits += low <= np.log(2) <= high
    assert hits / 2000 >= 0.94


# ---- the decision --------------------------------------------------------------------------------
def row(
    trial: int, median: float, spread: float, feasible: bool = True, role: str = ""
) -> ConfirmedRow:
    c = Candidate(trial, FusionConfig.defaults(), f"h{trial}", median, feasible, role)
    return ConfirmedRow(c, (median,) * 15, median, median - spread, median + spread, 0.0, feasible)


def test_a_candidate_whose_interval_lies_below_the_defaults_wins():
    rows = [row(0, 10.0, 1.0, role="defaults"), row(5, 5.0, 1.0), row(6, 4.0, 1.0)]
    winner, distinguishable, note = decide(rows, 0)
    assert (winner, distinguishable) == (6, True)
    assert "2.50x faster" in note


def test_overlapping_intervals_recommend_the_defaults():
    rows = [row(0, 10.0, 2.0, role="defaults"), row(5, 9.0, 2.0)]
    winner, distinguishable, note = decide(rows, 0)
    assert (winner, distinguishable) == (None, False)
    assert "defaults are recommended" in note


def test_an_infeasible_candidate_never_wins():
    rows = [row(0, 10.0, 1.0, role="defaults"), row(5, 1.0, 0.1, feasible=False)]
    assert decide(rows, 0)[0] is None


def test_defaults_over_the_bound_give_way_to_the_fastest_feasible():
    rows = [row(0, 10.0, 1.0, feasible=False, role="defaults"), row(5, 9.5, 1.0), row(6, 12.0, 1.0)]
    winner, distinguishable, note = decide(rows, 0)
    assert (winner, distinguishable) == (5, True) and "break the accuracy bound" in note


def test_without_defaults_the_fastest_feasible_wins():
    assert decide([row(5, 3.0, 1.0), row(6, 2.0, 1.0)], None)[0] == 6


# ---- interleaving --------------------------------------------------------------------------------
def test_measure_interleaved_rotates_the_order_every_round():
    calls: list[str] = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    from fusiontune.measure import MeasureConfig

    samples = measure_interleaved(
        fns, rounds=3, measure=MeasureConfig(warmup=0, number=1), min_sample_s=0.0
    )
    assert [len(s) for s in samples] == [3, 3, 3]
    timed = "".join(calls[6:])  # after one warmup call and one calibration call each
    assert timed == "abcbcacab"


def test_interleaved_timings_stop_timing_what_the_race_stops():
    from fusiontune.measure import MeasureConfig
    from fusiontune.measure.interleaved import interleaved_timings

    looks: list[list[int]] = []

    def stop(samples):
        looks.append([len(s) for s in samples])
        return [1] if len(samples[0]) == 2 else []

    timings = interleaved_timings(
        [lambda: None] * 3, 5, MeasureConfig(warmup=0, number=1), 0.0, stop=stop
    )
    assert [len(t.samples_s) for t in timings] == [5, 2, 5]
    assert looks == [[1, 1, 1], [2, 2, 2], [3, 2, 3], [4, 2, 4]]  # after every round but the last


def test_measure_interleaved_tells_a_slow_callable_from_a_fast_one():
    samples = measure_interleaved(
        [lambda: time.sleep(0.002), lambda: None], rounds=5, min_sample_s=0.0
    )
    assert min(samples[0]) > 0.0015 > max(samples[1])


# ---- on a study ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("confirm")
    (tmp / "space.toml").write_text(SPACE)
    space = load_space(tmp / "space.toml")
    workload = make_workload("mindspore_custom_op")
    url = f"sqlite:///{tmp / 'study.db'}"
    run_tune(space, LocalEvaluator(workload, space.measure), url, "c", 10, progress=False)
    return url, space, workload


def test_candidates_are_distinct_programs_plus_the_defaults(tuned):
    url, space, _ = tuned
    study = optuna.load_study(study_name="c", storage=url)
    candidates, defaults_trial = select_candidates(study, 2, space)
    assert defaults_trial == 0
    assert len({c.program_hash for c in candidates}) == len(candidates)
    assert any(c.trial == 0 for c in candidates)
    assert all(c.feasible for c in candidates if c.trial != 0)
    assert len(candidates) <= 3


def test_confirm_on_a_real_run_stores_the_schema(tuned):
    url, space, workload = tuned
    study = optuna.load_study(study_name="c", storage=url)
    lines: list[str] = []
    record = confirm(study, workload, space, top_k=2, rounds=6, echo=lines.append)
    store = StudyStore(optuna.load_study(study_name="c", storage=url))
    assert store.confirmation() == record
    assert Confirmation.from_json(record.to_json()) == record
    assert record.defaults_trial == 0 and record.node and record.finished == store.count_finished()
    assert (record.winner_trial is not None) == record.distinguishable
    for r in record.rows:
        assert r.ci_low_s <= r.median_s <= r.ci_high_s
        assert r.samples == 6 or f"clearly slower than the best: trial {r.trial} (" in record.note
    assert "confirmation" in lines[0] and record.note in lines[0]


def _synthetic_builds(monkeypatch, slow_key: str) -> list[str]:
    """Confirmation builds synthetic programs: ``slow_key``'s takes 3 ms a call, the others 0.3
    ms, and each returns the workload's reference. Returns the keys built, in order."""
    built: list[str] = []

    class Synthetic:
        def __init__(self, workload, slow: bool) -> None:
            self.workload = workload
            self.seconds = 3e-3 if slow else 3e-4

        def run(self, inputs):
            ref = self.workload.reference
            return {k: np.asarray(v, dtype=np.float32) for k, v in ref.items()}

        def bind(self, inputs) -> None:
            return None

        def execute(self) -> None:
            time.sleep(self.seconds)

    def fake_build(workload, config):
        built.append(config.key())
        program = Synthetic(workload, slow=config.key() == slow_key)
        return type("Built", (), {"program": program})()

    monkeypatch.setattr("fusiontune.tune.evaluate.build_candidate", fake_build)
    return built


def test_confirm_names_a_clearly_faster_program_the_winner(tuned, monkeypatch):
    """Synthetic programs: the defaults take 3 ms a call, every other configuration 0.3 ms."""
    url, space, workload = tuned
    defaults_key = StudyStore(optuna.load_study(study_name="c", storage=url)).trial(0).config.key()
    built = _synthetic_builds(monkeypatch, defaults_key)
    study = optuna.load_study(study_name="c", storage=url)
    record = confirm(study, workload, space, top_k=2, rounds=6, echo=lambda s: None)
    assert record.distinguishable is True
    fastest = min((r for r in record.rows if r.trial != 0), key=lambda r: r.median_s)
    assert record.winner_trial == fastest.trial
    assert len(built) == len(record.rows)  # each program built once


def test_confirm_can_be_read_back_by_the_report(tuned, tmp_path: Path):
    from fusiontune.report import build_report

    url, space, workload = tuned
    study = optuna.load_study(study_name="c", storage=url)
    confirm(study, workload, space, top_k=2, rounds=6, echo=lambda s: None)
    paths = build_report(tmp_path / "c", storage_url=url, study_name="c")
    assert (tmp_path / "c" / "fusion_switch.cfg") in paths


def test_the_shortlist_takes_the_sweeps_best_and_the_models_best_in_turn(tuned):
    url, space, _ = tuned
    study = optuna.load_study(study_name="c", storage=url)
    candidates, _ = select_candidates(study, 2, space)
    records = StudyStore(study).trials()
    feasible = [t for t in records if t.feasible]
    by_model = model_order(study, space, feasible)
    assert len(by_model) == len(feasible)
    programs = [c.program_hash for c in candidates]
    assert by_model[0].program_hash in programs
    assert len(select_candidates(study, 2)[0]) <= 3  # without the space: the sweep's order only


def test_the_confirmation_stops_timing_a_clearly_slower_candidate(tuned, monkeypatch):
    """Synthetic programs: one candidate takes 3 ms a call, the defaults and the rest 0.3 ms."""
    url, space, workload = tuned
    study = optuna.load_study(study_name="c", storage=url)
    candidates, _ = select_candidates(study, 2, space)
    slow_key = next(c.config.key() for c in candidates if c.trial != 0)
    _synthetic_builds(monkeypatch, slow_key)
    record = confirm(study, workload, space, top_k=2, rounds=8, echo=lambda s: None)
    slow = next(r for r in record.rows if r.trial != 0 and r.config_key == slow_key)
    assert 2 <= slow.samples < 8
    assert all(r.samples == 8 for r in record.rows if r is not slow)
    assert f"clearly slower than the best: trial {slow.trial} (" in record.note


def test_the_note_names_the_races_of_the_attempt_kept_not_of_the_last(tuned, monkeypatch):
    """The noise check measures all candidates again when one is too wide and keeps the least
    noisy attempt, which need not be the last. Scripted attempts: the first races out a clearly
    slower candidate and is wide on one row; the second races nothing and is wider. The first
    is kept, and its race is what the note says (the note once named the last attempt's)."""
    from fusiontune.measure import Timing

    url, space, workload = tuned
    study = optuna.load_study(study_name="c", storage=url)
    candidates, _ = select_candidates(study, 2, space)
    slow_key = next(c.config.key() for c in candidates if c.trial != 0)
    _synthetic_builds(monkeypatch, slow_key)
    order = [c.config.key() for c in candidates]  # the programs, in the order confirm times them
    attempts: list[int] = []

    def scripted(fns, n, cfg, min_sample_s, stop=None):
        attempts.append(len(fns))
        first = len(attempts) == 1
        samples: list[list[float]] = [[] for _ in fns]
        stopped: set[int] = set()
        for r in range(n):
            for i in range(len(fns)):
                if i in stopped:
                    continue
                base = 3e-3 if order[i] == slow_key and first else 3e-4
                wide = 1.0 + (0.3 if first else 0.9) * (r % 2) * (i == 0)
                samples[i].append(base * wide * (1 + 1e-3 * r))
            if stop is not None and r >= 1:
                stopped |= set(stop([tuple(s) for s in samples]))
        return [Timing.from_samples(tuple(s), 1) for s in samples]

    import fusiontune.tune.confirm as confirm_module

    monkeypatch.setattr(confirm_module, "interleaved_timings", scripted)
    record = confirm(study, workload, space, top_k=2, rounds=8, echo=lambda s: None)
    assert len(attempts) >= 2  # the first attempt was too wide: measured again
    slow = next(r for r in record.rows if r.config_key == slow_key)
    assert 2 <= slow.samples < 8  # raced out in the attempt kept
    assert f"clearly slower than the best: trial {slow.trial} (" in record.note
