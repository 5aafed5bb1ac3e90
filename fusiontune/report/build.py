"""Build ``results/<study>/`` from the study's storage alone: tables, report, plots, recommendation.

``fusiontune report results/<study>`` calls :func:`report_command`; the tuning loop calls
:func:`build_report` at the end of a sweep. Nothing is measured here: every number comes from the
records the loop wrote (DESIGN.md sections 8 and 11), so a report rebuilt from ``study.db`` alone is
the same report.

The recommendation (``fusion_switch.cfg`` and its sidecars) is, in order of preference: the winner
of the confirmation stage when it is distinguishable from the defaults; the defaults when the
confirmation found nothing distinguishable; the fastest feasible trial when no confirmation is
recorded yet; nothing when no trial is feasible.

The one exception to "nothing is measured here" is asked for by name: with ``profile=True``
(``fusiontune report --profile``) the recommended configuration's kernels are timed once and
stored as ``profile.json``, a record every later rebuild reads (:mod:`fusiontune.report._profile`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from fusiontune.config.flags import render_flags
from fusiontune.config.fusion_config import FusionConfig, JobPass, job_table
from fusiontune.config.fusion_result import write_fusion_result
from fusiontune.config.switch_file import dump_switch_json
from fusiontune.errors import UserError
from fusiontune.passes.base import GRAPH_FUSION, FusionReport
from fusiontune.passes.registry import BY_NAME
from fusiontune.report import plots
from fusiontune.report._apply import how_to_apply, how_to_apply_lines
from fusiontune.report._effects import EffectsReport, effect_blocks, switch_effects
from fusiontune.report._profile import load_profile, measure_profile, profile_blocks
from fusiontune.report._render import Block, to_html, to_markdown
from fusiontune.report.tables import (
    DEFAULTS,
    SPLIT_COLUMNS,
    SWITCH_COLUMNS,
    accuracy_attribution,
    baseline_trial,
    command_target,
    default_storage,
    effective_params,
    fmt_number,
    fmt_seconds,
    fmt_speedup,
    format_top,
    importance_evaluator,
    matched_passes,
    open_study,
    param_importance,
    pass_effect,
    ranked,
    searched_params,
    study_frame,
    top_rows,
)
from fusiontune.tune.records import EvalResult
from fusiontune.tune.store import Recommendation as StoredRecommendation
from fusiontune.tune.store import StudyStore, TrialRecord

NOT_DISTINGUISHABLE = (
    "No configuration is distinguishable from the defaults after re-measurement: "
    "the defaults are recommended."
)
NOT_CONFIRMED = (
    "No confirmation stage is recorded yet: the recommendation is the fastest feasible trial of "
    "the sweep, not measured again."
)
NO_FEASIBLE = "No trial is feasible yet: no fusion_switch.cfg was written."


@dataclass(frozen=True)
class Recommendation:
    """The configuration a report recommends, and why (one sentence)."""

    trial: int | None
    reason: str
    config: FusionConfig | None
    result: EvalResult | None


@dataclass(frozen=True)
class BuiltReport:
    """What :func:`write_report` wrote and chose.

    Attributes:
        paths: every file written, in the order of :func:`build_report`'s list.
        frame: the study's table (:func:`~fusiontune.report.tables.study_frame`), ranked.
        recommendation: the configuration recommended and why.
        apply_lines: for a terminal: the ATC command and the ``set_context`` line that apply the
            recommendation (none when nothing is recommended).
    """

    paths: list[Path]
    frame: pd.DataFrame
    recommendation: Recommendation
    apply_lines: tuple[str, ...] = ()


# ---- the recommendation --------------------------------------------------------------------------
def _trial_config(trial: TrialRecord) -> FusionConfig:
    if trial.config is not None:
        return trial.config
    # An older record without the config attr: the searched params over the registry defaults.
    params = trial.params
    explicit = {c.removeprefix("pass."): params[c] == "on" for c in SWITCH_COLUMNS if c in params}
    points = {c.removeprefix("split."): int(params[c]) for c in SPLIT_COLUMNS if c in params}
    return FusionConfig.resolve(
        explicit=explicit, split_points=points, source=f"trial {trial.number}"
    )


def _job_table(study: Any) -> tuple[JobPass, ...] | None:
    """The job's pass table of a command target's study (its ``target`` attr), else None."""
    target = command_target(study)
    if target is None:
        return None
    passes = dict(target.get("passes") or {})
    fixed = set(passes.get("not_switchable") or ())
    return job_table(
        JobPass(n, kind, n not in fixed) for kind in ("GraphFusion", "UBFusion") for n in passes.get(kind) or ()
    )


def _kind(name: str, config: FusionConfig | None) -> str:
    """The section a pass's statistics go in: from the configuration's table, else the registry's."""
    for p in config.pass_rows() if config is not None else ():
        if p.name == name:
            return str(p.kind)
    return BY_NAME[name].kind if name in BY_NAME else GRAPH_FUSION


def choose_recommendation(study: Any, frame: pd.DataFrame) -> Recommendation:
    """The configuration to take home: rank 1 of the one ranking (module docstring).

    Raises:
        UserError: the confirmation record names a trial the study does not have.
    """
    store = StudyStore(study)
    conf = store.confirmation()
    number: int | None
    if conf is not None and conf.distinguishable and conf.winner_trial is not None:
        number = conf.winner_trial
        reason = (
            f"Trial {number} is the winner of the confirmation stage: distinguishable from the "
            "defaults after re-measurement."
        )
    elif conf is not None:
        reason = NOT_DISTINGUISHABLE
        number = conf.defaults_trial if conf.defaults_trial is not None else baseline_trial(frame, DEFAULTS)
        if number is None:
            return Recommendation(None, reason, FusionConfig.defaults(_job_table(study)), None)
    elif not (best := ranked(frame)).empty:
        number, reason = int(best["number"].iloc[0]), NOT_CONFIRMED
    else:
        return Recommendation(None, NO_FEASIBLE, None, None)
    trials = {t.number: t for t in store.trials()}
    if number not in trials:
        raise UserError(
            f"study {study.study_name}: the confirmation names trial {number}, which it does not have"
        )
    trial = trials[number]
    result = trial.result
    reused = trial.reused_from
    if (result is None or not result.fusion.stats) and reused is not None and reused in trials:
        result = trials[reused].result or result
    return Recommendation(number, reason, _trial_config(trial), result)


def record_recommendation(study: Any, rec: Recommendation) -> None:
    """Write the recommendation into the study (a user attr optuna-dashboard shows), if it changed."""
    source = "sweep" if rec.reason == NOT_CONFIRMED else "confirmation"
    key = rec.config.key() if rec.config is not None else ""
    StudyStore(study).write_recommendation(StoredRecommendation(rec.trial, key, source, rec.reason))


def _write_recommendation(rec: Recommendation, out: Path) -> list[Path]:
    if rec.config is None:
        return []
    paths = [out / "fusion_switch.cfg", out / "graph_kernel_flags.txt", out / "best_config.json"]
    paths[0].write_text(dump_switch_json(rec.config), encoding="utf-8")
    paths[1].write_text(render_flags(rec.config) + "\n", encoding="utf-8")
    paths[2].write_text(json.dumps(rec.config.to_json(), indent=4) + "\n", encoding="utf-8")
    if rec.result is not None and rec.result.fusion.stats:
        counts = rec.result.fusion.counts()
        kinds = {name: _kind(name, rec.config) for name in counts}
        report = FusionReport.from_counts(counts, kinds)
        paths.append(write_fusion_result(report, out / "fusion_result.json"))
    return paths


# ---- the document --------------------------------------------------------------------------------
def _summary(study: Any, frame: pd.DataFrame) -> list[Block]:
    attrs = StudyStore(study).info().to_json()
    sizes = ", ".join(f"{k}={v}" for k, v in dict(attrs.get("sizes") or {}).items())
    states = frame["state"].value_counts()
    counts = ", ".join(f"{int(n)} {s.lower()}" for s, n in states.items())
    reused = int(frame["reused_from"].notna().sum())
    target = command_target(study)
    if target is None:
        what = f"Workload: `{attrs.get('workload', '?')}`" + (f" ({sizes})" if sizes else "") + "."
        against = "against the float64 reference"
    else:
        command = target.get("command")
        shown = command if isinstance(command, str) else " ".join(map(str, command or ()))
        what = (
            f"Target: your job, `{shown}` (working directory `{target.get('workdir', '.')}`,"
            f" timeout {target.get('timeout_s', '?')} s, {target.get('repeats', 1)} run(s) per"
            " configuration: the runtime is their median, the error their maximum)."
        )
        against = "as the job reports it"
    blocks: list[Block] = [
        ("p", what),
        (
            "p",
            f"Accuracy bound: `{attrs.get('metric', '?')} <= {attrs.get('bound', '?')}` {against}.",
        ),
        (
            "p",
            f"Trials: {len(frame)} ({counts}); {int(frame['feasible'].sum())} feasible; "
            f"{reused} reused the measurement of a trial with the same program.",
        ),
    ]
    if attrs.get("space_path"):
        sampler = f", sampler `{attrs['sampler']}`" if attrs.get("sampler") else ""
        blocks.append(("p", f"Search space: `{attrs['space_path']}`{sampler}."))
    return blocks


def _confirmation(study: Any, frame: pd.DataFrame) -> list[Block]:
    conf = StudyStore(study).confirmation()
    if conf is None:
        return [("p", "No confirmation stage is recorded (the sweep has not finished).")]
    defaults = conf.row(conf.defaults_trial) if conf.defaults_trial is not None else None
    headers = ["trial", "config", "median", "CI", "samples", "vs defaults", "error", "role"]
    rows = []
    for r in conf.rows:
        role = "winner" if r.trial == conf.winner_trial else ""
        if r.trial == conf.defaults_trial:
            role = ", ".join(filter(None, [role, "defaults"]))
        if r.noisy:
            role = ", ".join(filter(None, [role, "noisy"]))
        speed = defaults.median_s / r.median_s if defaults is not None and r.median_s else math.nan
        rows.append(
            [
                str(r.trial),
                f"`{r.config_key}`",
                fmt_seconds(r.median_s),
                f"[{fmt_seconds(r.ci_low_s)}, {fmt_seconds(r.ci_high_s)}]",
                str(r.samples),
                fmt_speedup(speed),
                fmt_number(r.error),
                role,
            ]
        )
    where = f" on {conf.node}" if conf.node else ""
    blocks: list[Block] = [
        ("p", f"Measured again{where}, interleaved in one process, with 95% confidence intervals of the medians."),
        ("table", headers, rows),
    ]
    if conf.winner_trial is not None and conf.distinguishable:
        blocks.append(("p", f"Winner: trial {conf.winner_trial}, distinguishable from the defaults."))
    else:
        blocks.append(("p", NOT_DISTINGUISHABLE))
    if conf.note:
        blocks.append(("p", f"Confirmation note: {conf.note}"))
    finished = int(frame["state"].isin(["COMPLETE", "FAIL", "PRUNED"]).sum())
    if 0 <= conf.finished < finished:
        blocks.append(
            (
                "p",
                f"This confirmation was taken when the study had {conf.finished} finished trials; it"
                f" has {finished} now: run the sweep to its end (or `fusiontune tune` again) to"
                " confirm the newer trials.",
            )
        )
    return blocks


def _baselines(study: Any) -> list[Block]:
    """The baseline measurements: every speedup is against one of them (same window, same node)."""
    found = StudyStore(study).baselines()
    if not found:
        return [
            (
                "p",
                "This study has no baseline measurements (a study of an earlier version): speedups"
                " are against its defaults and all-off trials.",
            )
        ]
    rows = []
    for b in found:
        when = datetime.fromtimestamp(b.time, tz=UTC).isoformat(timespec="seconds")
        noisy = ", ".join(n for n, r in (("defaults", b.defaults), ("all-off", b.all_off)) if r.noisy)
        rows.append(
            [b.id, b.window, b.node or "-", when, str(b.finished), fmt_seconds(b.defaults_s), fmt_seconds(b.all_off_s), noisy or "-"]
        )
    return [
        (
            "p",
            "The defaults and all-off, measured on every node when a sweep (or its resumption)"
            " starts and again at intervals. Each trial's speedups are against the latest of its"
            " own window and node (column `baseline` of trials.csv), never across windows.",
        ),
        ("table", ["baseline", "window", "node", "time (UTC)", "after trials", "defaults", "all-off", "noisy"], rows),
    ]


def _document(
    study: Any,
    frame: pd.DataFrame,
    rec: Recommendation,
    images: dict[str, Path | None],
    missing_plots: str | None,
    importance: dict[str, float] | None,
    method: str,
    searched: list[str],
    effective: list[str],
    never: list[str],
    out: Path,
    effects: EffectsReport,
) -> list[Block]:
    doc: list[Block] = [("h1", f"fusiontune report: {study.study_name}"), *_summary(study, frame)]
    doc += [("h2", "Recommendation"), ("p", rec.reason)]
    if rec.config is not None:
        doc.append(
            (
                "p",
                f"Trial {rec.trial if rec.trial is not None else '-'}: `fusion_switch.cfg`, "
                f"`graph_kernel_flags.txt` (`{render_flags(rec.config) or 'the defaults: no flags'}`), "
                "`best_config.json`" + ("" if rec.config.is_job else " (with the split points)")
                + ", `fusion_result.json`.",
            )
        )
    doc += how_to_apply(rec.config, out, StudyStore(study).info())
    doc += _fusion_stats(rec)
    doc += profile_blocks(load_profile(out), rec.config.key() if rec.config is not None else None)
    doc += [("h2", "Confirmation"), *_confirmation(study, frame)]
    headers, rows = top_rows(frame, 10)
    doc.append(("h2", "Top 10 feasible configurations"))
    doc.append(
        (
            "p",
            "One order for every table (this one, the terminal's, trials.csv): the recommendation,"
            " then the other confirmed configurations by their confirmed medians, then the sweep's"
            " trials by their speedup against their own baseline; column `ranked by` says which.",
        )
    )
    doc.append(("table", headers, rows) if rows else ("p", "No feasible configuration yet."))
    doc.append(("h2", "Plots"))
    if missing_plots:
        doc.append(("p", missing_plots))
    titles = {
        "best_so_far": "Best feasible runtime vs trial",
        "runtime_vs_error": "Runtime vs error",
        "pass_effect": "Per-pass effect",
        "param_importance": "Parameter importance",
    }
    doc += [("img", titles[k], p) for k, p in images.items() if p is not None]
    # The surrogate's effects supersede the old on/off median table (same passes, same
    # never-matched line, counts kept; effects adjusted for the other switches, with intervals).
    # The median on/off ratio still feeds the accuracy attribution below.
    effect = pass_effect(frame, effective)
    doc += effect_blocks(effects)
    if command_target(study) is None:  # a job's passes are the job's: fusiontune knows none inexact
        doc += _attribution(frame, effect, searched, StudyStore(study).info().metric)
    doc.append(("h2", "Parameter importance (median runtime)"))
    if importance is None:
        doc.append(("p", method))
    else:
        doc.append(
            (
                "p",
                f"optuna's {method} importance of each searched parameter for the median runtime.",
            )
        )
        doc.append(
            ("table", ["parameter", "importance"], [[k, f"{v:.3f}"] for k, v in importance.items()])
        )
    failed = frame[frame["state"] != "COMPLETE"]
    if not failed.empty:
        doc.append(("h2", "Trials that did not complete"))
        doc.append(
            (
                "table",
                ["trial", "state", "node", "reason"],
                [
                    [str(r.number), r.state, r.node or "-", (r.error_msg or "-")[:200]]
                    for r in failed.itertuples(index=False)
                ],
            )
        )
    doc += [("h2", "Baselines"), *_baselines(study)]
    info = StudyStore(study).info()
    if info.machine:
        doc += [
            ("h2", "Machine"),
            ("table", ["key", "value"], [[str(k), str(v)] for k, v in info.machine.items()]),
        ]
    if info.space_toml:
        doc += [("h2", "Search space"), ("pre", info.space_toml.rstrip())]
    return doc


def _fusion_stats(rec: Recommendation) -> list[Block]:
    """Per pass, how often it matched and how often it applied in the recommended configuration."""
    if rec.config is None:
        return []
    doc: list[Block] = [("h2", "Fusion statistics of the recommended configuration")]
    fusion = rec.result.fusion.counts() if rec.result is not None else {}
    if not fusion:
        doc.append(("p", "The recommended trial reported no fusion statistics."))
        return doc
    source = rec.result.extra.get("fusion_source") if rec.result is not None else None
    where = " (from the job's log lines)" if source == "log lines" else f" (from `{source}`)" if source else ""
    doc.append(("p", f"CANN's `matched_times` / `effected_times` per pass{where}, as in `fusion_result.json`."))
    rows = [
        [name, _kind(name, rec.config), str(m), str(e)] for name, (m, e) in fusion.items()
    ]
    doc.append(("table", ["pass", "kind", "matched_times", "effected_times"], rows))
    return doc


def _attribution(frame: pd.DataFrame, effect: pd.DataFrame, searched: list[str], metric: str) -> list[Block]:
    """The accuracy-attribution table: what each speed-for-accuracy trade costs and brings."""
    table = accuracy_attribution(frame, effect, searched)
    if table.empty:
        return []
    rows = []
    for r in table.rename(columns={"pass": "pass_"}).itertuples(index=False):
        error = "not measured" if r.trial is None else f"{fmt_number(r.error)} (trial {r.trial})"
        within = "-" if r.trial is None else ("yes" if r.feasible else "no")
        speedup = "-" if math.isnan(r.speedup) else f"{r.speedup:.2f}"
        rows.append([r.pass_, f"{r.expected:.1e}", error, within, speedup, f"{r.n_on} / {r.n_off}"])
    return [
        ("h2", "Accuracy attribution (inexact passes)"),
        (
            "p",
            f"For each pass that trades accuracy for speed: the declared error, the {metric} of the"
            " defaults with only that pass on, whether that holds the bound, and the median speedup"
            " the pass brings over the sweep (median speedup with it on / with it off).",
        ),
        ("table", ["pass", "declared error", f"{metric}, only it on", "within bound", "speedup on / off", "trials on / off"], rows),
    ]


# ---- entry points --------------------------------------------------------------------------------
def write_report(
    results_dir: str | Path,
    storage_url: str | None = None,
    study_name: str | None = None,
    profile: bool = False,
) -> BuiltReport:
    """:func:`build_report`, returning the table and the recommendation too (for a terminal summary).

    With ``profile``, the recommended configuration's kernels are timed first and stored as
    ``profile.json`` (:mod:`fusiontune.report._profile`); a built-in workload or ONNX model only.

    Raises:
        UserError: as :func:`build_report`; with ``profile``, also a command target's study, no
            configuration recommended, or a workload that cannot be built here.
    """
    out = Path(results_dir)
    if storage_url is None and not out.is_dir():
        raise UserError(f"{out}: no such results folder")
    study = open_study(storage_url or default_storage(out), study_name, fallback_name=out.name)
    out.mkdir(parents=True, exist_ok=True)
    frame = study_frame(study)
    paths = [out / "trials.csv"]
    frame.to_csv(paths[0], index=False)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        pass
    else:
        paths.append(out / "trials.parquet")
        frame.to_parquet(paths[-1], index=False)
    searched = searched_params(study)
    effective, never = effective_params(study, searched)
    importance, method, target = param_importance(study, effective)
    effects = switch_effects(frame, effective, never, matched_passes(study))
    missing = plots.matplotlib_missing()
    images: dict[str, Path | None] = {}
    if missing is None:
        info = StudyStore(study).info()
        metric, bound = info.metric, info.bound
        images["best_so_far"] = plots.plot_best_so_far(frame, out / "best_so_far.png")
        images["runtime_vs_error"] = plots.plot_runtime_vs_error(
            frame, metric, bound, out / "runtime_vs_error.png"
        )
        images["pass_effect"] = plots.plot_effects(effects, out / "pass_effect.png")
        if importance is not None:
            images["param_importance"] = plots.plot_importance(
                study, target, importance_evaluator(study)[0], out / "param_importance.png", effective
            )
    paths += [p for p in images.values() if p is not None]
    rec = choose_recommendation(study, frame)
    record_recommendation(study, rec)
    profiled: list[Path] = []
    if profile:
        if rec.config is None:
            raise UserError(f"{out}: no configuration is recommended yet: nothing to profile")
        info = StudyStore(study).info()
        profiled.append(measure_profile(info, rec.config, rec.trial, out, info.target))
    doc = _document(
        study, frame, rec, images, missing, importance, method, searched, effective, never, out,
        effects,
    )
    (out / "report.md").write_text(to_markdown(doc), encoding="utf-8")
    (out / "report.html").write_text(
        to_html(doc, f"fusiontune report: {study.study_name}"), encoding="utf-8"
    )
    paths += [out / "report.md", out / "report.html", *_write_recommendation(rec, out), *profiled]
    apply = how_to_apply_lines(rec.config, out, StudyStore(study).info())
    return BuiltReport(paths, frame, rec, tuple(apply))


def build_report(
    results_dir: str | Path, storage_url: str | None = None, study_name: str | None = None
) -> list[Path]:
    """Write every table, plot, report and recommendation file of a study into ``results_dir``.

    Args:
        results_dir: ``results/<study>``; created when a ``storage_url`` is given.
        storage_url: a SQLAlchemy URL; default ``sqlite:///<results_dir>/study.db``.
        study_name: the study; default the only study in the storage, else the folder's name.

    Returns:
        The paths written: trials.csv (and trials.parquet with pyarrow), the PNG plots (with
        matplotlib), report.md, report.html, and, when a configuration is recommended,
        fusion_switch.cfg, graph_kernel_flags.txt, best_config.json and fusion_result.json.

    Raises:
        UserError: the folder, the database or the study does not exist, or the storage cannot
            be opened.
    """
    return write_report(results_dir, storage_url, study_name).paths


@dataclass(frozen=True)
class ReportOptions:
    """What :func:`report_command` rebuilds.

    Attributes:
        results_dir: the folder written (``results/<study>``).
        storage: the study's SQLAlchemy URL (default ``sqlite:///<results_dir>/study.db``).
        study: the study's name (default: the only study in the storage).
        profile: time the recommended configuration's kernels first (``profile.json``).
    """

    results_dir: Path
    storage: str | None = None
    study: str | None = None
    profile: bool = False


def report_command(options: ReportOptions) -> int:
    """Rebuild a study's report from its database alone (``fusiontune report RESULTS_DIR``).

    Prints the ranked top 10, the recommendation and every path written.

    Args:
        options: the folder, and optionally the storage URL and the study name.

    Returns:
        0.

    Raises:
        UserError: see :func:`build_report`.
    """
    built = write_report(options.results_dir, options.storage, options.study, options.profile)
    print(format_top(built.frame, 10))
    print()
    print(built.recommendation.reason)
    for line in built.apply_lines:
        print(line)
    print("wrote:")
    for path in built.paths:
        print(f"  {path}")
    return 0
