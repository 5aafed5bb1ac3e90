"""Racing: the sequential test's error rate and its savings, by simulation.

Each simulated race draws the incumbent's ``n`` runtimes and the candidate's ``R`` runtimes
(lognormal noise), then looks after each run as the command evaluator does; a race ends at the
first stop or after ``R`` runs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fusiontune.measure.racing import RACE, RaceConfig, clearly_worse, worse_p_value

RACES = 2000


def simulate(
    slower: float,
    noise: float,
    repeats: int = 5,
    races: int = RACES,
    outliers: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """The runs each simulated race made (``repeats`` when it was not raced out).

    Args:
        slower: the candidate's true runtime over the incumbent's (1.2: 20% slower).
        noise: the standard deviation of the log-runtimes (0.05: about 5%).
        repeats: runs per configuration; the incumbent has as many.
        races: how many races.
        outliers: the chance of a run being 30% slower (on either side).
        seed: the generator's seed.
    """
    rng = np.random.default_rng(seed)

    def draw(n: int, log_mean: float) -> np.ndarray:
        logs = log_mean + rng.normal(0.0, noise, n) + 0.3 * (rng.random(n) < outliers)
        return np.exp(logs)

    made = np.empty(races, dtype=int)
    for r in range(races):
        incumbent = draw(repeats, 0.0)
        candidate = draw(repeats, math.log(slower))
        made[r] = repeats
        for k in range(1, repeats + 1):
            if clearly_worse(candidate[:k], incumbent, repeats).stop:
                made[r] = k
                break
    return made


def test_equal_candidates_are_raced_out_at_most_alpha_of_the_time() -> None:
    made = simulate(1.0, 0.05)
    assert np.mean(made < 5) <= RACE.alpha / 2  # 0.95%: Bonferroni and the margin are conservative


def test_a_candidate_at_the_margin_is_raced_out_at_most_alpha_of_the_time() -> None:
    made = simulate(1.0 + RACE.margin, 0.05)
    assert np.mean(made < 5) <= RACE.alpha  # 3.6%: the tight case of H0


def test_outliers_do_not_break_the_level() -> None:
    made = simulate(1.0, 0.05, outliers=0.1)
    assert np.mean(made < 5) <= RACE.alpha  # 0.85%


@pytest.mark.parametrize("repeats", [3, 10])
def test_the_level_holds_for_any_number_of_repeats(repeats: int) -> None:
    made = simulate(1.0 + RACE.margin, 0.05, repeats=repeats, races=1000, seed=repeats)
    assert np.mean(made < repeats) <= RACE.alpha


def test_a_20_percent_slower_candidate_stops_early_and_saves_runs() -> None:
    made = simulate(1.2, 0.05)
    assert np.mean(made < 5) >= 0.9  # 95% raced out
    assert np.mean(made) <= 3.0  # 2.7 runs of 5 on average: 46% saved
    assert np.mean(made == 2) >= 0.4  # the first look already stops most of them


def test_with_little_noise_a_slower_candidate_stops_at_the_first_look() -> None:
    made = simulate(1.2, 0.02)
    assert np.mean(made == RACE.min_runs) >= 0.75  # 2.2 runs on average: 55% saved


def test_no_look_before_min_runs_nor_at_the_last_run() -> None:
    incumbent = [1.0, 1.01, 0.99, 1.0, 1.0]
    assert not clearly_worse([9.0], incumbent, 5).stop
    assert clearly_worse([9.0, 9.1], incumbent, 5).stop
    assert not clearly_worse([9.0, 9.1, 9.0, 9.0, 9.2], incumbent, 5).stop  # nothing left to save
    assert not clearly_worse([9.0, 9.1], incumbent, 2).stop  # repeats 2: no look at all
    assert not clearly_worse([9.0, 9.1], [1.0], 5).stop  # the incumbent's spread is unknown


def test_a_faster_candidate_is_never_raced_out() -> None:
    incumbent = [1.0, 1.3, 0.7, 1.2, 0.9]
    decision = clearly_worse([0.5, 0.5, 0.5], incumbent, 5)
    assert not decision.stop and decision.p_value > 0.99


def test_identical_runs_use_the_noise_floor() -> None:
    # A job that prints its runtime rounded: no spread at all on either side.
    assert clearly_worse([1.05, 1.05], [1.0] * 5, 5).stop  # 5% slower, beyond margin + floor
    assert not clearly_worse([1.02, 1.02], [1.0] * 5, 5).stop  # at the margin: as fast
    p, ratio = worse_p_value([1.0, 1.0], [1.0, 1.0])
    assert ratio == 1.0 and p > 0.9


def test_the_level_splits_alpha_over_the_looks() -> None:
    assert RACE.looks(5) == 3 and RACE.level(5) == pytest.approx(RACE.alpha / 3)
    assert RACE.looks(2) == 0 and RACE.level(2) == 0.0
    decision = clearly_worse([2.0, 2.1], [1.0, 1.02, 0.98], 5)
    assert decision.stop and decision.level == pytest.approx(RACE.alpha / 3)
    assert "after 2 of 5 runs" in decision.describe() and "2.0" in decision.describe()


def test_bad_settings_and_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="min_runs"):
        RaceConfig(min_runs=1)
    with pytest.raises(ValueError, match="alpha"):
        RaceConfig(alpha=0.0)
    with pytest.raises(ValueError, match="finite and > 0"):
        worse_p_value([1.0, math.nan], [1.0, 1.0])


def test_a_sweep_of_equal_configurations_races_few_of_them_out() -> None:
    # The incumbent is the fastest so far of many equal configurations: its samples are the
    # luckiest (the winner's curse), so more are raced out than against a fixed incumbent.
    rng = np.random.default_rng(1)
    raced = total = 0
    for _sweep in range(50):
        incumbent: np.ndarray | None = None
        for _trial in range(40):
            runs = np.exp(rng.normal(0.0, 0.05, 5))
            k = 5
            if incumbent is not None:
                k = next((k for k in range(1, 6) if clearly_worse(runs[:k], incumbent, 5).stop), 5)
            raced += k < 5
            total += 1
            runs = runs[:k]
            if incumbent is None or np.median(runs) < np.median(incumbent):
                incumbent = runs
    assert raced / total <= 2 * RACE.alpha  # 3.3%: no longer below alpha by design, but no lost points either


def test_a_race_that_looks_less_often_tests_at_a_higher_level() -> None:
    incumbent = [1.0, 1.02, 0.98, 1.01, 0.99]
    every_run = clearly_worse([1.1, 1.12, 1.09, 1.11, 1.1], incumbent, 15)
    once_per_round = clearly_worse([1.1, 1.12, 1.09, 1.11, 1.1], incumbent, 15, looks=2)
    assert every_run.level == pytest.approx(RACE.alpha / 13)
    assert once_per_round.level == pytest.approx(RACE.alpha / 2)
    assert "than trial 3" in once_per_round.describe("trial 3")
