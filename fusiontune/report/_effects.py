"""Each switch's effect on the runtime, with 95% intervals, from the surrogate fitted to a study.

The surrogate (:class:`fusiontune.tune.surrogate.HorseshoeModel`, the fusion sampler's runtime
model: intercept, main effects, pairwise products with a horseshoe prior) is fitted on
``log(median runtime)`` of every measured
configuration, feasible or not (the error is a separate axis). With the +-1 coding (on = +1), a
main effect ``e`` is the change of log runtime when the switch goes off -> on, so

    share = exp(e) - 1                          (the same at any runtime)
    time  = share * median runtime of the defaults

and an interval maps end by end (``exp`` is monotone). A split point is one-hot coded against its
first value (0, no cut): its effect is that cut against none. A pair's effect ``e_ij`` is how much
the first switch's on-effect grows (in log runtime) when the second is on, relative to their
average; as a share, ``exp(e_ij) - 1``.

Which trials: every COMPLETE trial with a median runtime, less those that switch a pass the
search held fixed (the all-off baseline turns off unsearched passes too: its runtime would be
credited to the searched ones), counted once per distinct (configuration of the fitted switches,
program): a reused measurement of the same program under the same fitted switches is the same
observation, not a second one. Passes that never matched (:func:`~fusiontune.report.tables.
effective_params`) are not fitted: switching them changes nothing.

Intervals are equal-tailed quantiles of the posterior draws (:data:`DRAWS` of them). Nothing here
varies from build to build: the Gibbs chain is seeded, the rows sorted by trial number, the output
rounded, so a report rebuilt from the same database is the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from fusiontune.report._render import Block
from fusiontune.report.tables import DEFAULTS, baseline_median, fmt_seconds, param_pass

LEVEL = 0.95
TOP_INTERACTIONS = 5
MIN_CONFIGURATIONS = 3
SPANS_ZERO = "not distinguishable from 0"
TITLE = "Per-pass effect (surrogate model, 95% intervals)"
# Gibbs sweeps of the report's fit: more kept draws than the sampler's Thompson draws need, for
# the tails of a 95% interval (2.5% of 2000 draws: 50 beyond each end).
SWEEPS, BURN, DRAWS = 2500, 500, 2000


@dataclass(frozen=True)
class SwitchEffect:
    """One main effect or pairwise interaction, as a share of the runtime and as a time.

    Attributes:
        terms: one feature label (``pass.X``, ``split.P.point=v``) or two (an interaction).
        share, share_low, share_high: ``exp(e) - 1`` of the effect on log runtime and its interval.
        seconds, seconds_low, seconds_high: the same shares of the defaults' median (NaN without
            a measured defaults trial).
        n_on, n_off: fitted configurations with the feature +1 / -1 (for a pair: with both +1,
            and the rest).
    """

    terms: tuple[str, ...]
    share: float
    share_low: float
    share_high: float
    seconds: float
    seconds_low: float
    seconds_high: float
    n_on: int
    n_off: int

    @property
    def distinguishable(self) -> bool:
        """Whether the interval excludes 0."""
        return self.share_low > 0 or self.share_high < 0


@dataclass(frozen=True)
class EffectsReport:
    """The effects of a study's switches, or why there are none.

    Attributes:
        main: main effects, largest ``|share|`` first.
        interactions: the strongest pairwise interactions (at most ``top``), largest first.
        never: searched passes that never matched (not fitted).
        constant: fitted candidates that took one value in every used configuration (no estimate).
        configurations: distinct configurations fitted.
        trials: measured trials they came from.
        held_fixed: measured trials left out because they switch a pass the search held fixed.
        features: the model's features (main effects, plus the pairs when ``pairs_fitted``).
        pairs_fitted: whether pairwise interactions were in the model.
        defaults_s: the defaults' median runtime (None when not measured).
        skipped: one sentence saying why no effect was estimated; None when they were.
    """

    main: tuple[SwitchEffect, ...]
    interactions: tuple[SwitchEffect, ...]
    never: tuple[str, ...]
    constant: tuple[str, ...]
    configurations: int
    trials: int
    held_fixed: int
    features: int
    pairs_fitted: bool
    defaults_s: float | None
    skipped: str | None = None


# ---- the data ------------------------------------------------------------------------------------
def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    rows = frame[(frame["state"] == "COMPLETE") & (frame["median_s"] > 0)]
    return rows.sort_values("number", kind="stable").reset_index(drop=True)


def _reference(rows: pd.DataFrame, col: str) -> object:
    """The value a held-fixed column has: the defaults trial's, else the most common one."""
    defaults = rows[rows["role"] == DEFAULTS]
    if len(defaults):
        return defaults[col].iloc[0]
    counts = rows[col].astype(str).value_counts(sort=False)
    top = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return rows.loc[rows[col].astype(str) == top, col].iloc[0]


def _held_fixed(
    rows: pd.DataFrame, fitted: Sequence[str], never: Sequence[str], matched: Collection[str] | None
) -> pd.Series:
    """True for the rows that switch a pass (or a split point) that matched and is not fitted."""
    off_model = [
        c
        for c in rows.columns
        if c.startswith(("pass.", "split."))
        and c not in fitted
        and param_pass(c) not in never
        and (matched is None or param_pass(c) in matched)
    ]
    bad = pd.Series(False, index=rows.index)
    for col in off_model:
        ref = _reference(rows, col)
        bad |= rows[col].astype(str) != str(ref)
    return bad


def _choices(rows: pd.DataFrame, col: str) -> tuple[object, ...]:
    """A dimension's values seen in the fitted rows: ("off", "on") or the ints in order (0 first)."""
    if col.startswith("pass."):
        return ("off", "on")
    return tuple(sorted(int(v) for v in rows[col].dropna().unique()))


def _noise_sd(rows: pd.DataFrame) -> np.ndarray:
    """Each measurement's own sd of log runtime, from its 95% interval of the median (NaN: none)."""
    low = (
        rows["ci_low_s"].to_numpy(dtype=float) if "ci_low_s" in rows else np.full(len(rows), np.nan)
    )
    high = (
        rows["ci_high_s"].to_numpy(dtype=float)
        if "ci_high_s" in rows
        else np.full(len(rows), np.nan)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = (np.log(high) - np.log(low)) / (2 * 1.959964)
    return np.where(np.isfinite(sd) & (sd > 0), sd, np.nan)


# ---- the fit -------------------------------------------------------------------------------------
def switch_effects(
    frame: pd.DataFrame,
    effective: Sequence[str],
    never: Sequence[str] = (),
    matched: Collection[str] | None = None,
    level: float = LEVEL,
    top: int = TOP_INTERACTIONS,
) -> EffectsReport:
    """Fit the surrogate to a study's measured trials and read off each switch's effect.

    Args:
        frame: the study table (:func:`~fusiontune.report.tables.study_frame`).
        effective: the searched parameters whose pass matched (``effective_params``).
        never: the searched passes that never matched: listed, not fitted.
        matched: the passes that matched in some trial (``matched_passes``); a trial that
            switches an unfitted pass outside it still counts. None: every pass may matter.
        level: the probability of the intervals.
        top: how many pairwise interactions to keep.

    Returns:
        The effects, or an :class:`EffectsReport` whose ``skipped`` says in one sentence why
        none could be estimated (no measured trial, too few for the features).
    """
    from fusiontune.tune.surrogate import Coding, HorseshoeModel, pair_index

    measured = _measured(frame)
    candidates = [c for c in effective if c in frame.columns]
    report = EffectsReport(
        main=(),
        interactions=(),
        never=tuple(sorted(never)),
        constant=(),
        configurations=0,
        trials=len(measured),
        held_fixed=0,
        features=0,
        pairs_fitted=False,
        defaults_s=baseline_median(frame, DEFAULTS),
    )
    if measured.empty:
        return replace(report, skipped="Effects not estimated: no trial finished with a runtime.")
    if not candidates:
        return replace(
            report, skipped="Effects not estimated: no searched pass matched in the workload."
        )
    fixed = _held_fixed(measured, candidates, never, matched)
    rows = measured[~fixed]
    constant = [c for c in candidates if rows[c].astype(str).nunique() < 2]
    names = [c for c in candidates if c not in constant]
    # One observation per (fitted configuration, program): a reused measurement is not a new one.
    rows = rows.dropna(subset=names).drop_duplicates(subset=[*names, "program_hash"], keep="first")
    report = replace(
        report,
        trials=len(measured) - int(fixed.sum()),
        held_fixed=int(fixed.sum()),
        constant=tuple(constant),
        configurations=len(rows),
    )
    if not names:
        return replace(
            report,
            skipped="Effects not estimated: no matched pass was switched both ways in the"
            " measured trials.",
        )
    coding = Coding(names, {c: _choices(rows, c) for c in names})
    d, n = coding.n_features, len(rows)
    n_pairs = len(pair_index(coding.block)[0])
    # A sparse prior copes with fewer observations than features, not with far fewer: at
    # least half as many distinct configurations as features, else the pairs are left out,
    # and below that nothing is fitted.
    pairs = n_pairs > 0 and 2 * n >= d + n_pairs
    if n < MIN_CONFIGURATIONS or 2 * n < d:
        need = max(MIN_CONFIGURATIONS, math.ceil(d / 2))
        return replace(
            report,
            features=d,
            skipped=f"Effects not estimated: {n} distinct measured configuration(s) for {d}"
            f" switch feature(s); the model needs at least {need}.",
        )
    X = coding.encode_many(rows[names].to_dict("records"))
    y = np.log(rows["median_s"].to_numpy(dtype=float))
    model = HorseshoeModel(
        interactions=pairs, block=coding.block, iterations=SWEEPS, burn=BURN, keep=DRAWS
    )
    model.fit(X, y, noise_sd=_noise_sd(rows))
    column = dict(zip(coding.labels, X.T, strict=True))
    found = []
    for e in model.effects(list(coding.labels), level=level):
        on = np.all([column[t] > 0 for t in e.terms], axis=0)
        share, low, high = (_round(math.expm1(v)) for v in (e.mean, e.low, e.high))
        at = report.defaults_s if report.defaults_s is not None else math.nan
        found.append(
            SwitchEffect(
                e.terms,
                share,
                low,
                high,
                share * at,
                low * at,
                high * at,
                n_on=int(on.sum()),
                n_off=int((~on).sum()),
            )
        )
    found.sort(key=lambda e: (-abs(e.share), e.terms))
    return replace(
        report,
        main=tuple(e for e in found if len(e.terms) == 1),
        interactions=tuple(e for e in found if len(e.terms) == 2)[:top],
        features=d + (n_pairs if pairs else 0),
        pairs_fitted=pairs,
    )


def _round(value: float) -> float:
    """Six significant digits: the last bits of a BLAS sum never reach the report."""
    return float(f"{value:.6g}") + 0.0


# ---- text ----------------------------------------------------------------------------------------
def term_label(term: str) -> str:
    """A feature as the report names it: ``pass.X`` -> ``X``; ``split.P.cut=4`` -> ``P.cut = 4``."""
    if term.startswith("pass."):
        return term.removeprefix("pass.")
    name, _, value = term.removeprefix("split.").partition("=")
    return f"{name} = {value}" if value else name


def fmt_share(share: float, low: float, high: float, level: float = LEVEL) -> str:
    """``-12.3% (95% CI -14.1% to -10.2%)``."""
    return f"{_pct(share)} ({level:.0%} CI {_pct(low)} to {_pct(high)})"


def _pct(v: float) -> str:
    return f"{round(v * 100, 1) + 0.0:+.1f}%"


def time_unit(defaults_s: float) -> tuple[str, float, int]:
    """The unit a table of times uses, its scale, and decimals: three figures of the defaults."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if defaults_s >= scale or unit == "ns":
            break
    digits = max(1, 2 - math.floor(math.log10(defaults_s / scale)))
    return unit, scale, digits


def fmt_time(seconds: float, low: float, high: float, defaults_s: float | None) -> str:
    """``-0.41 ms (-0.47 to -0.34)`` in the unit of the defaults' runtime; ``-`` without one."""
    if not defaults_s or math.isnan(seconds):
        return "-"
    unit, scale, digits = time_unit(defaults_s)

    def f(v: float) -> str:
        return f"{round(v / scale, digits) + 0.0:+.{digits}f}"

    return f"{f(seconds)} {unit} ({f(low)} to {f(high)})"


def _never_line(never: Sequence[str]) -> Block:
    return (
        "p",
        "Never matched in this workload (no effect possible: switching them changes nothing, so"
        f" they are not fitted, ranked here or in the importance): {', '.join(never)}.",
    )


def effect_blocks(report: EffectsReport) -> list[Block]:
    """The report's section: the main effects, the strongest interactions, the never-matched.

    Args:
        report: what :func:`switch_effects` found.

    Returns:
        Blocks for :mod:`fusiontune.report._render`, starting with the section's ``h2``.
    """
    doc: list[Block] = [("h2", TITLE)]
    if report.skipped is not None:
        doc.append(("p", report.skipped))
        if report.never:
            doc.append(_never_line(report.never))
        return doc
    unit = time_unit(report.defaults_s)[0] if report.defaults_s else None
    at = (
        f" and in {unit} at the defaults' median runtime ({fmt_seconds(report.defaults_s)})"
        if report.defaults_s
        else " (no measured defaults trial: no times)"
    )
    left = (
        f"; {report.held_fixed} trial(s) that also switch passes the search held fixed (such as"
        " the all-off baseline) are left out"
        if report.held_fixed
        else ""
    )
    model = "main effects and pairwise interactions" if report.pairs_fitted else "main effects"
    doc.append(
        (
            "p",
            f"A Bayesian linear model ({model}, sparsity prior) of log median runtime, fitted on"
            f" {report.configurations} distinct measured configuration(s) from {report.trials}"
            f" trial(s), feasible or not{left}. Each effect is the change when the switch goes"
            f" off -> on (a split point: that cut against none), as a share of the runtime{at};"
            " intervals are 95% credible intervals.",
        )
    )
    if report.never:
        doc.append(_never_line(report.never))
    doc.append(
        (
            "table",
            [
                "switch",
                "effect on runtime",
                "at the defaults' runtime",
                "configurations on / off",
                "note",
            ],
            [
                [
                    term_label(e.terms[0]),
                    fmt_share(e.share, e.share_low, e.share_high),
                    fmt_time(e.seconds, e.seconds_low, e.seconds_high, report.defaults_s),
                    f"{e.n_on} / {e.n_off}",
                    "" if e.distinguishable else SPANS_ZERO,
                ]
                for e in report.main
            ],
        )
    )
    if report.constant:
        doc.append(
            (
                "p",
                "Not switched both ways in the fitted trials (no estimate): "
                + ", ".join(term_label(c) for c in report.constant)
                + ".",
            )
        )
    if not report.pairs_fitted:
        doc.append(
            (
                "p",
                f"Pairwise interactions not estimated: {report.configurations} configurations are"
                " too few for the pairs of these switches (at least half as many as the model's"
                " features are needed).",
            )
        )
    elif report.interactions:
        doc.append(
            (
                "p",
                f"The {len(report.interactions)} strongest pairwise interactions: how much more (a"
                " share) switching the first on changes the runtime when the second is on than on"
                " average over the second (and as much less when it is off).",
            )
        )
        doc.append(
            (
                "table",
                [
                    "switches",
                    "interaction",
                    "at the defaults' runtime",
                    "configurations both on / not",
                    "note",
                ],
                [
                    [
                        " × ".join(term_label(t) for t in e.terms),
                        fmt_share(e.share, e.share_low, e.share_high),
                        fmt_time(e.seconds, e.seconds_low, e.seconds_high, report.defaults_s),
                        f"{e.n_on} / {e.n_off}",
                        "" if e.distinguishable else SPANS_ZERO,
                    ]
                    for e in report.interactions
                ],
            )
        )
    return doc


def effects_table(report: EffectsReport) -> Mapping[str, SwitchEffect]:
    """The main effects by report label (for plots and tests)."""
    return {term_label(e.terms[0]): e for e in report.main}
