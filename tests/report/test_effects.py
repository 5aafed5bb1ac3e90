"""The report's per-pass effects: a planted study whose runtimes follow known effects and noise.

The study is written the way the tuning loop writes it (optuna trials with ``result`` and
``config`` user attrs); the log runtime of a configuration is

    log t = log 2 ms + sum_i e_i x_i / 2 + e_ij x_i x_j / 2 + N(0, 0.01^2)      (x = +-1, on = +1)

so the surrogate's off -> on effect of a switch is ``e_i`` and of the pair ``e_ij``.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import optuna
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.measure import ErrorMetrics
from fusiontune.passes.base import FusionReport
from fusiontune.report import build_report
from fusiontune.report._effects import (
    SPANS_ZERO,
    TITLE,
    EffectsReport,
    fmt_share,
    fmt_time,
    switch_effects,
)
from fusiontune.report.tables import effective_params, matched_passes, searched_params, study_frame
from fusiontune.tune.records import EvalResult

optuna.logging.set_verbosity(optuna.logging.WARNING)

STUDY = "planted"
BOUND = 1e-3
SEARCHED = ("SoftmaxFusionPass", "GeluFusionPass", "TbeEltwiseFusionPass", "LayerNormFusionPass")
NEVER = "RmsNormFusionPass"  # searched, never matches: its switch must change nothing
FIXED = "AddLayerNormFusionPass"  # matches, not searched: only the all-off trial turns it off
EFFECT = {  # off -> on, in log runtime
    "SoftmaxFusionPass": -0.30,
    "GeluFusionPass": -0.10,
    "TbeEltwiseFusionPass": 0.06,
    "LayerNormFusionPass": 0.0,
}
PAIR = ("SoftmaxFusionPass", "GeluFusionPass")
PAIR_EFFECT = 0.08
NOISE = 0.01
BASE_S = 2e-3  # the defaults come out near 1.8 ms
DISTRIBUTIONS = {
    f"pass.{p}": optuna.distributions.CategoricalDistribution(["off", "on"])
    for p in (*SEARCHED, NEVER)
}


def _runtime(config: FusionConfig, rng: np.random.Generator) -> float:
    x = {p: 1.0 if config.switches[p] else -1.0 for p in SEARCHED}
    log_t = math.log(BASE_S) + sum(EFFECT[p] * x[p] / 2 for p in SEARCHED)
    log_t += PAIR_EFFECT * x[PAIR[0]] * x[PAIR[1]] / 2
    if not config.switches[FIXED]:
        log_t += math.log(3.0)  # a held-fixed pass off: the all-off trial is much slower
    return math.exp(log_t + rng.normal(0.0, NOISE))


def _result(number: int, config: FusionConfig, median: float | None) -> EvalResult:
    if median is None:
        return EvalResult.failure(
            number, config, "TypingError: kernel failed", node="n", program_hash=f"h{number}"
        )
    matched = {p: (1, int(config.switches[p])) for p in (*SEARCHED, FIXED)}
    return EvalResult(
        trial=number,
        config_key=config.key(),
        program_hash=f"h{number}",
        status="ok",
        median_s=median,
        iqr_s=median * 0.02,
        cv=0.01,
        noisy=False,
        attempts=1,
        min_s=median * 0.98,
        samples_s=(median,) * 5,
        errors=ErrorMetrics(3e-7, 1e-7, 5e-8, 1e-8, True),
        kernels=10,
        compile_s=0.1,
        peak_bytes=4096,
        node="n",
        fusion=FusionReport.from_counts({**matched, NEVER: (0, 0)}),
    )


def planted_trials(
    replicates: int = 2, seed: int = 0
) -> list[tuple[FusionConfig, str | None, bool]]:
    """The defaults, the all-off, then every on/off combination of the searched switches
    ``replicates`` times (the never-matched switch alternating): (config, role, failed)."""
    trials: list[tuple[FusionConfig, str | None, bool]] = [
        (FusionConfig.defaults(), "defaults", False),
        (FusionConfig.all_off(), "all_off", False),
    ]
    rng = np.random.default_rng(seed)
    for rep in range(replicates):
        for k, bits in enumerate(itertools.product([False, True], repeat=len(SEARCHED))):
            switches = dict(zip(SEARCHED, bits, strict=True))
            switches[NEVER] = bool((k + rep + int(rng.integers(2))) % 2)
            trials.append((FusionConfig.defaults().with_switches(**switches), None, False))
    return trials


def make_planted_study(
    results: Path, trials: list[tuple[FusionConfig, str | None, bool]], seed: int = 0
) -> str:
    """A study in ``results/study.db``, the tuning loop's format, with the planted runtimes."""
    results.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{results / 'study.db'}"
    study = optuna.create_study(study_name=STUDY, storage=url)
    study.set_user_attr(
        "space_toml", 'workload = "mlp"\n[accuracy]\nmetric = "max_rel"\nbound = 1e-3\n'
    )
    study.set_user_attr("workload", "mlp")
    study.set_user_attr("metric", "max_rel")
    study.set_user_attr("bound", BOUND)
    rng = np.random.default_rng(seed)
    for number, (config, role, failed) in enumerate(trials):
        median = None if failed else _runtime(config, rng)
        result = _result(number, config, median)
        attrs: dict[str, object] = {
            "result": result.to_json(),
            "config": config.to_json(),
            "program_hash": result.program_hash,
        }
        if role:
            attrs["role"] = role
        params = {
            name: "on" if config.switches[name.removeprefix("pass.")] else "off"
            for name in DISTRIBUTIONS
        }
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=DISTRIBUTIONS,
                values=None if failed else [median],
                state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE,
                user_attrs=attrs,
                system_attrs={} if failed else {"constraints": [1e-7 - BOUND]},
            )
        )
    return url


def _effects(results: Path, level: float = 0.95) -> EffectsReport:
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{results / 'study.db'}")
    effective, never = effective_params(study, searched_params(study))
    return switch_effects(study_frame(study), effective, never, matched_passes(study), level=level)


def _section(md: str) -> str:
    return md.split(f"## {TITLE}")[1].split("\n## ")[0]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results") / STUDY
    make_planted_study(out, planted_trials())
    return out


def test_main_effects_are_ranked_and_the_null_one_spans_zero(planted: Path) -> None:
    report = _effects(planted)
    assert report.skipped is None and report.pairs_fitted
    found = {e.terms[0].removeprefix("pass."): e for e in report.main}
    assert set(found) == set(SEARCHED)
    for e in report.main:
        assert e.seconds == pytest.approx(e.share * report.defaults_s)
        assert e.share_low < e.share < e.share_high
    assert [e.terms[0] for e in report.main][:3] == [
        "pass.SoftmaxFusionPass",
        "pass.GeluFusionPass",
        "pass.TbeEltwiseFusionPass",
    ]
    assert [n for n, e in found.items() if not e.distinguishable] == ["LayerNormFusionPass"]
    assert found["SoftmaxFusionPass"].share == pytest.approx(
        math.expm1(EFFECT["SoftmaxFusionPass"]), abs=0.02
    )


def test_the_95_intervals_cover_the_planted_effects_over_40_noise_draws(planted: Path) -> None:
    """The same configurations with fresh noise, 40 times: the intervals of the four main effects
    and the planted pair cover the planted values about 95% of the time (the evidence-fitted
    noise runs a little low at 33 observations: at least 85% of the 200 intervals)."""
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{planted / 'study.db'}")
    effective, never = effective_params(study, searched_params(study))
    matched = matched_passes(study)
    frame = study_frame(study)
    x = {p: np.where(frame[f"pass.{p}"] == "on", 1.0, -1.0) for p in SEARCHED}
    log_t = math.log(BASE_S) + sum(EFFECT[p] * x[p] / 2 for p in SEARCHED)
    log_t = log_t + PAIR_EFFECT * x[PAIR[0]] * x[PAIR[1]] / 2
    log_t = log_t + math.log(3.0) * (frame[f"pass.{FIXED}"] == "off").to_numpy()
    planted_terms = {(f"pass.{p}",): v for p, v in EFFECT.items()}
    planted_terms[tuple(f"pass.{p}" for p in PAIR)] = PAIR_EFFECT
    covered = []
    for seed in range(40):
        noisy = frame.copy()
        noisy["median_s"] = np.exp(log_t + np.random.default_rng(seed).normal(0, NOISE, len(frame)))
        report = switch_effects(noisy, effective, never, matched)
        by_terms = {e.terms: e for e in (*report.main, *report.interactions)}
        for terms, value in planted_terms.items():
            e = by_terms.get(terms) or by_terms[terms[::-1]]
            covered.append(e.share_low <= math.expm1(value) <= e.share_high)
    assert len(covered) == 200 and sum(covered) >= 170, sum(covered)


def test_the_planted_interaction_is_the_strongest_and_covered(planted: Path) -> None:
    report = _effects(planted, level=0.99)
    strongest = report.interactions[0]
    assert set(strongest.terms) == {f"pass.{p}" for p in PAIR}
    assert strongest.share_low <= math.expm1(PAIR_EFFECT) <= strongest.share_high
    assert strongest.distinguishable
    assert len(report.interactions) == 5
    assert all(not e.distinguishable for e in report.interactions[1:])


def test_never_matched_passes_are_listed_apart_and_not_fitted(planted: Path) -> None:
    report = _effects(planted)
    assert report.never == (NEVER,)
    assert all(f"pass.{NEVER}" not in e.terms for e in (*report.main, *report.interactions))
    build_report(planted)
    section = _section((planted / "report.md").read_text())
    assert (
        f"(no effect possible: switching them changes nothing, so they are not fitted, ranked here or in the importance): {NEVER}."
        in section
    )
    assert f"| {NEVER} |" not in section and f"{NEVER} ×" not in section


def test_a_trial_that_switches_a_held_fixed_pass_is_left_out(planted: Path) -> None:
    """The all-off trial also turns off AddLayerNorm (matched, not searched): 3x slower, not
    the searched switches' doing, so it is not fitted."""
    report = _effects(planted)
    assert report.held_fixed == 1
    assert report.trials == 2 + 2 * 16 - 1
    assert report.configurations == report.trials  # every program measured once


def test_the_section_shows_shares_times_and_notes(planted: Path) -> None:
    build_report(planted)
    section = _section((planted / "report.md").read_text())
    row = next(line for line in section.splitlines() if line.startswith("| SoftmaxFusionPass |"))
    assert "(95% CI " in row and " ms (" in row
    null = next(line for line in section.splitlines() if line.startswith("| LayerNormFusionPass |"))
    assert null.rstrip(" |").endswith(SPANS_ZERO)
    assert (
        "| SoftmaxFusionPass × GeluFusionPass |" in section
        or "| GeluFusionPass × SoftmaxFusionPass |" in section
    )


def test_too_few_trials_is_one_line_instead_of_a_table(tmp_path: Path) -> None:
    trials = planted_trials(replicates=1)[:3]  # defaults, all-off (left out), one more
    out = tmp_path / STUDY
    make_planted_study(out, trials)
    report = _effects(out)
    assert report.skipped is not None and report.skipped.startswith("Effects not estimated:")
    assert report.main == ()
    build_report(out)
    section = _section((out / "report.md").read_text())
    assert report.skipped in section and "|" not in section


def test_all_trials_failed_is_one_line(tmp_path: Path) -> None:
    trials = [(c, role, True) for c, role, _ in planted_trials(replicates=1)[:6]]
    out = tmp_path / STUDY
    make_planted_study(out, trials)
    report = _effects(out)
    assert report.skipped == "Effects not estimated: no trial finished with a runtime."


def test_fewer_configurations_than_the_pairs_need_fits_main_effects_only(tmp_path: Path) -> None:
    """4 switches: 4 main effects, 6 pairs; 4 configurations are enough for the mains only."""
    out = tmp_path / STUDY
    make_planted_study(out, planted_trials(replicates=1)[:2] + planted_trials(replicates=1)[2:18:6])
    report = _effects(out)
    assert report.skipped is None and not report.pairs_fitted and report.interactions == ()
    build_report(out)
    assert "Pairwise interactions not estimated" in _section((out / "report.md").read_text())


def test_two_builds_give_the_same_bytes(planted: Path) -> None:
    build_report(planted)
    first = {n: (planted / n).read_bytes() for n in ("report.md", "report.html")}
    build_report(planted)
    assert {n: (planted / n).read_bytes() for n in first} == first


def test_shares_and_times_format_with_signs_and_the_defaults_unit() -> None:
    assert fmt_share(-0.123, -0.141, -0.102) == "-12.3% (95% CI -14.1% to -10.2%)"
    assert fmt_share(0.0, -0.0004, 0.02) == "+0.0% (95% CI +0.0% to +2.0%)"
    assert fmt_time(-0.41e-3, -0.47e-3, -0.34e-3, 3.3e-3) == "-0.41 ms (-0.47 to -0.34)"
    assert fmt_time(-61.8e-9, -70e-9, -55e-9, 284e-9) == "-61.8 ns (-70.0 to -55.0)"
    assert fmt_time(math.nan, math.nan, math.nan, None) == "-"
