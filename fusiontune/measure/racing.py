"""Racing: stop repeating a configuration once its runs are clearly slower than the incumbent's.

A command target runs the user's job ``repeats`` times per configuration, minutes each. After run
``k`` of ``R`` (``min_runs <= k < R``: a look at ``k = R`` saves nothing) the candidate's runtimes
``x_1..x_k`` are compared with the incumbent's samples ``y_1..y_n`` (the fastest feasible
measurement so far) by a one-sided Welch t-test on the log-runtimes, with a margin ``m``::

    H0: E[log x] - E[log y] <= log(1 + m)     (the candidate is at most m slower)
    H1: E[log x] - E[log y] >  log(1 + m)     (clearly slower)
    t  = (mean(log x) - mean(log y) - log(1 + m)) / sqrt(v_x / k + v_y / n)
    df = Welch-Satterthwaite,  p = P(T_df > t)

with ``v`` the sample variances of the logs, each floored at ``noise_floor**2`` (a job whose
runs agree to the last printed digit still has a timer resolution and drift). The candidate is
raced out when ``p <= alpha / (R - min_runs)``: Bonferroni over the ``R - min_runs`` looks, so

    P(a candidate at most m slower than the incumbent is ever raced out) <= alpha

for normal log-runtimes (the t-test's model), whatever ``R``. ``min_runs`` is 2: Welch's test
needs the candidate's own spread (one run cannot tell a slow configuration from a slow run), so
racing saves runs only when ``R >= 3``. A candidate that may be faster is never raced out: the
test only ever stops on evidence that it is slower.

Simulated (``tests/measure/test_racing.py``, 2000 races each, ``R = n = 5``, lognormal noise):
equal distributions, 5% noise: 0.95% raced out; a candidate exactly 2% slower (the margin, the
tight case of H0): 3.6% (3.7% with ``R = 3``, 3.3% with ``R = 10``); with 10% of the runs 30%
slower outliers: 0.85%. A candidate 20% slower with 5% noise is raced out 95% of the time,
after 2.7 runs on average: 46% of its runs saved (20% slower, 2% noise: 2.2 runs, 55% saved;
``R = 10``, 5% noise: 3.1 runs of 10, 69% saved).

The level holds against a given incumbent. A sweep's incumbent is the fastest of many
measurements, and its samples are luckier than its configuration (the winner's curse): in a
simulated sweep of 40 equal configurations with 5% noise, 3.3% of them were raced out against the
best so far (none with 1% noise). A raced-out configuration keeps its measurement (the median of
the runs made), so the harm of a false stop is a less precise median, not a lost point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class RaceConfig:
    """The sequential test's settings.

    Attributes:
        alpha: the chance to race out a candidate at most ``margin`` slower than the incumbent,
            over all looks of one race.
        margin: the relative slowdown (0.02: 2%) a candidate may have and still count as "as
            fast": run-to-run drift over a night is about this size.
        min_runs: the first look is after this many runs (>= 2: the candidate's own spread).
        noise_floor: the smallest standard deviation of the log-runtimes assumed (0.005: 0.5%).
    """

    alpha: float = 0.05
    margin: float = 0.02
    min_runs: int = 2
    noise_floor: float = 0.005

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")
        if not self.margin >= 0.0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.min_runs < 2:
            raise ValueError(f"min_runs must be >= 2 (the candidate's spread), got {self.min_runs}")
        if not self.noise_floor > 0.0:
            raise ValueError(f"noise_floor must be > 0, got {self.noise_floor}")

    def looks(self, max_runs: int) -> int:
        """How many times a race of ``max_runs`` runs is tested: after runs min_runs..max_runs-1."""
        return max(0, max_runs - self.min_runs)

    def level(self, max_runs: int, looks: int | None = None) -> float:
        """The level of one look: ``alpha`` split over the looks (Bonferroni); 0 when none.

        ``looks`` defaults to one after each run (:meth:`looks`); a race that looks less often
        (the confirmation, once per round) splits ``alpha`` over fewer.
        """
        looks = self.looks(max_runs) if looks is None else looks
        return self.alpha / looks if looks > 0 else 0.0


RACE = RaceConfig()
"""The settings every race uses (the sweep's trials and the command target's confirmation)."""


@dataclass(frozen=True)
class RaceDecision:
    """One look of a race.

    Attributes:
        stop: the candidate is clearly slower: stop repeating it.
        runs: the candidate's runs so far.
        max_runs: the runs the race would make without stopping.
        p_value: the one-sided p-value (1.0 when the look was not tested).
        level: the level this look rejects at (``alpha / looks``).
        ratio: the candidate's geometric-mean runtime over the incumbent's (NaN when not tested).
    """

    stop: bool
    runs: int
    max_runs: int
    p_value: float = 1.0
    level: float = 0.0
    ratio: float = math.nan

    def describe(self, than: str = "the incumbent") -> str:
        """``clearly slower than the incumbent after 2 of 5 runs (1.21x, p = 0.0031 <= 0.0167)``."""
        return (
            f"clearly slower than {than} after {self.runs} of {self.max_runs} runs"
            f" ({self.ratio:.2f}x, p = {self.p_value:.2g} <= {self.level:.3g})"
        )


def worse_p_value(
    candidate: Sequence[float], incumbent: Sequence[float], config: RaceConfig = RACE
) -> tuple[float, float]:
    """The one-sided Welch p-value that ``candidate`` is more than ``margin`` slower.

    Args:
        candidate: its runtimes (> 0), at least 2.
        incumbent: the incumbent's runtimes (> 0), at least 2.
        config: margin and noise floor.

    Returns:
        (p-value, ratio of the geometric means candidate / incumbent).

    Raises:
        ValueError: fewer than 2 samples on a side, or a runtime that is not finite and > 0.
    """
    x = _logs(candidate, "candidate")
    y = _logs(incumbent, "incumbent")
    floor = config.noise_floor**2
    a = max(float(np.var(x, ddof=1)), floor) / len(x)
    b = max(float(np.var(y, ddof=1)), floor) / len(y)
    se = math.sqrt(a + b)
    df = (a + b) ** 2 / (a * a / (len(x) - 1) + b * b / (len(y) - 1))
    diff = float(np.mean(x) - np.mean(y))
    t = (diff - math.log1p(config.margin)) / se
    return float(stats.t.sf(t, df)), math.exp(diff)


def clearly_worse(
    candidate: Sequence[float],
    incumbent: Sequence[float],
    max_runs: int,
    config: RaceConfig = RACE,
    looks: int | None = None,
) -> RaceDecision:
    """One look of the race: stop repeating ``candidate`` now?

    Not tested (``stop`` False) while fewer than ``config.min_runs`` runs are in, once
    ``max_runs`` are (stopping saves nothing), or when the incumbent has fewer than 2 samples.

    Args:
        candidate: the candidate's runtimes so far (seconds, > 0).
        incumbent: the incumbent's runtimes (seconds, > 0).
        max_runs: the runs the candidate gets when it is not raced out (``target.repeats``).
        config: the test's settings.
        looks: how many looks the whole race makes, when not one after each run from
            ``min_runs`` to ``max_runs - 1`` (the level is ``alpha / looks``).

    Returns:
        The decision, with its p-value and level when tested.
    """
    k = len(candidate)
    if k < config.min_runs or k >= max_runs or len(incumbent) < 2:
        return RaceDecision(False, k, max_runs)
    level = config.level(max_runs, looks)
    if level <= 0.0:
        return RaceDecision(False, k, max_runs)
    p, ratio = worse_p_value(candidate, incumbent, config)
    return RaceDecision(p <= level, k, max_runs, p, level, ratio)


def _logs(samples: Sequence[float], name: str) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"the {name} needs at least 2 runtimes, got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(x > 0)):
        raise ValueError(f"the {name}'s runtimes must be finite and > 0")
    return np.log(x)
