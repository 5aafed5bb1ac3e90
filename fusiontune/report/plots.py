"""The report's plots, as PNG files, drawn with matplotlib (the optional extra ``plots``).

matplotlib is imported lazily: :func:`matplotlib_missing` says in one sentence what to install,
and the report still writes its tables without it. Figures are drawn on the Agg backend and
closed after saving, so a long sweep that rebuilds its report does not accumulate them.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fusiontune.report._effects import EffectsReport, term_label
from fusiontune.report.tables import baseline_median, best_so_far, pareto_front, pass_effect

MISSING_SENTENCE = (
    "Plots were not drawn: matplotlib is not installed (pip install 'fusiontune[plots]')."
)


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else the sentence the report prints instead."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return MISSING_SENTENCE
    return None


def _pyplot() -> Any:
    import matplotlib

    # Agg unless the caller (a notebook) already chose a backend through pyplot.
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _scatter(ax: Any, x: pd.Series, rows: pd.DataFrame) -> None:
    """Runtime (ms) against ``x``: feasible trials as dots, those that break the bound as crosses."""
    ok = rows["feasible"].to_numpy(dtype=bool)
    y = rows["median_s"] * 1e3
    if ok.any():
        ax.scatter(x[ok], y[ok], s=14, color="tab:blue", label="feasible")
    if (~ok).any():
        ax.scatter(x[~ok], y[~ok], s=18, marker="x", color="tab:red", label="breaks the bound")


def _runtime_scale(ax: Any, runtimes: pd.Series) -> None:
    """A log runtime axis when runtimes span more than a factor of 10 (all-off vs fused can)."""
    low, high = float(runtimes.min()), float(runtimes.max())
    if low > 0 and high / low > 10:
        ax.set_yscale("log")


def plot_best_so_far(frame: pd.DataFrame, path: Path) -> Path | None:
    """Best feasible median runtime after each trial, over every measured trial.

    Args:
        frame: the study table (:func:`fusiontune.report.tables.load_study_frame`).
        path: the PNG to write.

    Returns:
        ``path``, or None when no trial was measured.
    """
    frame = frame.sort_values("number", kind="stable")  # the table leads with the ranking
    measured = frame[frame["median_s"].notna()]
    if measured.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    feasible = measured[measured["feasible"]]
    _scatter(ax, measured["number"], measured)
    if not feasible.empty:
        best = best_so_far(frame)
        ax.step(best.index, best * 1e3, where="post", color="black", label="best feasible so far")
    for role, style in (("defaults", "--"), ("all_off", ":")):
        label = role.replace("_", "-")
        own = measured[f"baseline_{role}_s"]
        if own.notna().any():  # each trial's own baseline (its window, its node): drift shows
            ax.step(
                measured["number"], own * 1e3, where="post", color="gray", linestyle=style,
                linewidth=1, label=f"{label} (each trial's baseline)",
            )
        elif (base := baseline_median(frame, role)) is not None:  # a study with no baseline records
            ax.axhline(base * 1e3, color="gray", linestyle=style, linewidth=1, label=label)
    _runtime_scale(ax, measured["median_s"])
    ax.set_xlabel("trial")
    ax.set_ylabel("median runtime (ms)")
    ax.set_title("Best feasible runtime vs trial")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_runtime_vs_error(
    frame: pd.DataFrame, metric: str, bound: float, path: Path
) -> Path | None:
    """Runtime against error for every measured trial, the bound line and the Pareto front.

    Args:
        frame: the study table.
        metric: the bounded error metric (axis label).
        bound: the accuracy bound (a vertical line; NaN: none).
        path: the PNG to write.

    Returns:
        ``path``, or None when no trial has both a runtime and a finite error.
    """
    done = frame[frame["median_s"].notna() & frame["error"].notna()]
    done = done[done["error"].map(math.isfinite)]
    if done.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    _scatter(ax, done["error"], done)
    front = pareto_front(done)
    ax.step(
        front["error"],
        front["median_s"] * 1e3,
        where="post",
        color="black",
        linewidth=1,
        label="Pareto front",
    )
    if math.isfinite(bound):
        ax.axvline(bound, color="tab:red", linestyle="--", linewidth=1, label=f"bound {bound:g}")
    positive = done.loc[done["error"] > 0, "error"]
    if len(positive) == len(done):
        ax.set_xscale("log")
    elif not positive.empty:
        # symlog: exact configurations (error 0) stay on the plot next to tiny rounding errors.
        linthresh = float(positive.min())
        if math.isfinite(bound) and bound > 0:
            linthresh = min(linthresh, bound)
        ax.set_xscale("symlog", linthresh=linthresh)
        ax.set_xlim(left=-0.5 * linthresh)  # errors are never negative
    _runtime_scale(ax, done["median_s"])
    ax.set_xlabel(f"error ({metric})")
    ax.set_ylabel("median runtime (ms)")
    ax.set_title("Runtime vs error")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_pass_effect(
    frame: pd.DataFrame, searched: Sequence[str] | None, path: Path
) -> Path | None:
    """For each searched pass: median speedup vs defaults with it on and off.

    Args:
        frame: the study table.
        searched: the searched parameters (see :func:`fusiontune.report.tables.pass_effect`).
        path: the PNG to write.

    Returns:
        ``path``, or None when no pass was switched both ways in measured trials.
    """
    effect = pass_effect(frame, searched)
    if effect.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.45 * len(effect)))
    y = range(len(effect))
    ax.barh([i + 0.2 for i in y], effect["on"], height=0.4, color="tab:green", label="on")
    ax.barh([i - 0.2 for i in y], effect["off"], height=0.4, color="tab:gray", label="off")
    ax.set_yticks(list(y), effect["pass"], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("median speedup vs defaults")
    ax.set_title("Per-pass effect")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_effects(report: EffectsReport, path: Path) -> Path | None:
    """A forest plot of the surrogate's effects: each switch's share with its 95% interval.

    Main effects first, then the strongest pairwise interactions, each largest first; a bar
    crossing the 0 line is an effect not distinguishable from 0.

    Args:
        report: what :func:`fusiontune.report._effects.switch_effects` found.
        path: the PNG to write.

    Returns:
        ``path``, or None when no effect was estimated.
    """
    rows = [*report.main, *report.interactions]
    if report.skipped is not None or not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.4 * len(rows)))
    y = list(range(len(rows)))
    share = [100 * e.share for e in rows]
    low = [100 * (e.share - e.share_low) for e in rows]
    high = [100 * (e.share_high - e.share) for e in rows]
    colors = ["tab:blue" if len(e.terms) == 1 else "tab:purple" for e in rows]
    for i, e in enumerate(rows):
        ax.errorbar(
            share[i],
            i,
            xerr=[[low[i]], [high[i]]],
            fmt="o",
            color=colors[i],
            capsize=3,
            markerfacecolor=colors[i] if e.distinguishable else "white",
        )
    ax.set_yticks(y, [" x ".join(term_label(t) for t in e.terms) for e in rows], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    if report.interactions and report.main:
        ax.axhline(len(report.main) - 0.5, color="gray", linewidth=0.5, linestyle="--")
    ax.set_xlabel("runtime change when switched on, % (95% interval; hollow: spans 0)", fontsize=8)
    ax.set_title("Per-pass effect (surrogate model)", fontsize=10)
    return _save(fig, path)


def plot_importance(
    study: Any,
    target: Callable[[Any], float] | None,
    evaluator: Any,
    path: Path,
    params: Sequence[str] | None = None,
) -> Path:
    """optuna's parameter-importance bar chart (``optuna.visualization.matplotlib``).

    Args:
        study: the ``optuna.Study``.
        target: the value to explain (the runtime); required for a multi-objective study.
        evaluator: the importance evaluator (seeded, so the chart matches the report's table).
        path: the PNG to write.
        params: the parameters to show (those of passes that matched); None: every one.

    Returns:
        ``path``.

    Raises:
        Exception: whatever optuna raises when importances cannot be computed (too few trials).
    """
    import optuna.visualization.matplotlib as ovm

    _pyplot()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning on every matplotlib plot
        ax = ovm.plot_param_importances(
            study,
            evaluator=evaluator,
            params=list(params) if params else None,
            target=target,
            target_name="median runtime",
        )
    return _save(ax.figure, path)
