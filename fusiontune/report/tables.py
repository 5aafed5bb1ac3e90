"""The trials of a study as a pandas table, read from its optuna storage alone.

The storage schema is the one the tuning loop writes (DESIGN.md section 8): parameters
``pass.<Name>`` ("off" / "on") and ``split.<Pass>.<point>`` (int); the objective ``median_s`` (and
``error`` for NSGA-II); the constraint ``error - bound`` in the trial's system attr
``constraints``; user attrs ``result`` (``EvalResult.to_json()``), ``config``
(``FusionConfig.to_json()``), ``program_hash``, ``reused_from`` and ``role`` ("defaults" /
"all_off"). Nothing here measures anything.

A study of a command target (the study attr ``target``, the user's own job) has one ``pass.*``
column per switchable pass of the job's table and no ``split.*`` columns; its bounded metric is
the ``error`` the job reported.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import urllib.parse
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fusiontune.errors import UserError
from fusiontune.measure import METRICS
from fusiontune.passes.registry import PASSES
from fusiontune.tune.store import (  # noqa: F401 (ALL_OFF, DEFAULTS: the roles, re-exported)
    ALL_OFF,
    DEFAULTS,
    Baseline,
    Confirmation,
    StudyStore,
    TrialRecord,
    speedups,
)

MIN_IMPORTANCE_TRIALS = 5  # below this, any importance estimate is noise

SWITCH_COLUMNS = tuple(f"pass.{p.name}" for p in PASSES if p.switchable)
SPLIT_COLUMNS = tuple(f"split.{p.name}.{sp.name}" for p in PASSES for sp in p.split_points)
_LEAD = ("number", "state", "role", "status")
_MEASURED = (
    "median_s", "iqr_s", "cv", "min_s", "ci_low_s", "ci_high_s", "noisy",
    *METRICS, "error", "constraint", "feasible",
)
_TAIL = (
    "speedup_vs_defaults",
    "speedup_vs_all_off",
    "baseline",
    "baseline_defaults_s",
    "baseline_all_off_s",
    "program_hash",
    "reused_from",
    "kernels",
    "compile_s",
    "node",
    "config_key",
    "error_msg",
    "datetime_start",
    "datetime_complete",
)


# ---- loading -------------------------------------------------------------------------------------
def default_storage(results_dir: str | Path) -> str:
    """``sqlite:///<results_dir>/study.db``, the storage the tuning loop writes by default."""
    return f"sqlite:///{Path(results_dir) / 'study.db'}"


SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = ("studies", "trials", "study_user_attributes", "version_info", "alembic_version")
"""Tables every optuna RDB storage has. ``version_info`` and ``alembic_version`` must also hold
their row: optuna writes one into either when it finds it empty, which a reader must not cause."""
STUDY_INFO_KEY = "space_toml"
"""The study user attribute every fusiontune study has from its creation on (``StudyInfo``)."""


def open_study(
    storage_url: str, study_name: str | None = None, fallback_name: str | None = None
) -> Any:
    """Load an existing optuna study read-only; never creates a database, a table or a study.

    Before optuna touches the storage, it is checked to be an optuna database without writing
    anything (SQLite: the file's header, then its tables through a ``mode=ro`` connection; other
    backends: SQLAlchemy's inspector), since optuna's ``RDBStorage`` writes its schema into
    whatever it is pointed at. The chosen study must then be a fusiontune one (see
    :func:`check_fusiontune_study`).

    Args:
        storage_url: a SQLAlchemy URL (``sqlite:///results/x/study.db``, ``postgresql://...``).
        study_name: the study; None: the only study in the storage, else ``fallback_name``.
        fallback_name: the name tried when the storage holds several studies (the folder name).

    Returns:
        The ``optuna.Study``.

    Raises:
        UserError: the SQLite file does not exist, the storage is not an optuna database or
            cannot be opened, the study is not in it (the message lists the studies that are),
            or it is not a fusiontune study.
    """
    import optuna

    if storage_url.startswith("sqlite:///"):
        path = Path(storage_url.removeprefix("sqlite:///").partition("?")[0])
        if not path.is_file():
            raise UserError(f"{path}: no such study database (run `fusiontune tune` first)")
        check_sqlite_study_database(path)
    else:
        check_rdb_study_database(storage_url)
    try:
        storage = optuna.storages.RDBStorage(storage_url, skip_table_creation=True)
        names = [
            s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
        ]
    except Exception as exc:  # SQLAlchemy / driver errors: say which storage, in one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {storage_url}: {reason}") from None
    if study_name is None:
        if len(names) == 1:
            study_name = names[0]
        elif fallback_name in names:
            study_name = fallback_name
        else:
            found = ", ".join(names) or "none"
            raise UserError(f"{storage_url}: choose a study with --study (studies: {found})")
    elif study_name not in names:
        raise UserError(
            f"{storage_url}: no study {study_name!r} (studies: {', '.join(names) or 'none'})"
        )
    study = optuna.load_study(study_name=study_name, storage=storage)
    check_fusiontune_study(study, storage_url)
    return study


def _not_a_study(where: str, why: str) -> UserError:
    return UserError(
        f"cannot open storage {where}: not a fusiontune study database ({why}); nothing was written"
    )


def check_sqlite_study_database(path: Path) -> None:
    """Check, writing nothing, that an SQLite file is an initialised optuna database.

    Args:
        path: the database file (it exists).

    Raises:
        UserError: ``cannot open storage <path>: not a fusiontune study database (<why>);
            nothing was written``:
            an empty file, a file that is not SQLite, an SQLite database without optuna's
            tables (or with ``version_info`` / ``alembic_version`` empty), or one SQLite
            cannot read.
    """
    try:
        with path.open("rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not header:
        raise _not_a_study(str(path), "an empty file")
    if header != SQLITE_HEADER:
        raise _not_a_study(str(path), "not an SQLite file")
    # mode=ro: the check itself never writes, not even the journal of a transaction it opens.
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            tables = {r[0] for r in rows}
            missing = [t for t in OPTUNA_TABLES if t not in tables]
            if missing:
                raise _not_a_study(str(path), f"no optuna tables: {', '.join(missing)} missing")
            for table in ("version_info", "alembic_version"):
                if conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0:
                    raise _not_a_study(str(path), f"optuna's {table} table is empty")
    except sqlite3.Error as e:
        raise _not_a_study(str(path), f"SQLite cannot read it: {e}") from None


def check_rdb_study_database(storage_url: str) -> None:
    """Check, writing nothing, that a server database (PostgreSQL, MySQL) holds optuna's tables.

    Best effort: a storage that cannot be reached or inspected is left to optuna, whose error
    then names it; only a database reached and found without the tables is refused here.

    Raises:
        UserError: the database has no optuna tables, or their version rows are missing.
    """
    from fusiontune.tune._storage import display_url

    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(storage_url)
    except Exception:  # noqa: BLE001 - a bad URL or a missing driver: optuna says which below
        return
    where = display_url(storage_url)
    try:
        with engine.connect() as conn:
            tables = set(sqlalchemy.inspect(conn).get_table_names())
            missing = [t for t in OPTUNA_TABLES if t not in tables]
            if missing:
                raise _not_a_study(where, f"no optuna tables: {', '.join(missing)} missing")
            for table in ("version_info", "alembic_version"):
                count = conn.execute(sqlalchemy.text(f"SELECT COUNT(*) FROM {table}")).scalar()
                if not count:
                    raise _not_a_study(where, f"optuna's {table} table is empty")
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - unreachable server and the like: optuna's error says it
        return
    finally:
        engine.dispose()


def check_fusiontune_study(study: Any, storage_url: str) -> None:
    """Refuse an optuna study that fusiontune did not create.

    fusiontune writes the study's ``StudyInfo`` (``space_toml`` among its user attributes) right
    after creating it, before any trial. A study with neither user attributes nor trials is one
    interrupted in between and is accepted; one with attributes or trials but no ``space_toml``
    belongs to another program.

    Raises:
        UserError: the study has user attributes or trials, and no ``space_toml`` attribute.
    """
    attrs = study.user_attrs
    if STUDY_INFO_KEY in attrs or (not attrs and not study.get_trials(deepcopy=False)):
        return
    from fusiontune.tune._storage import display_url

    raise UserError(
        f"{display_url(storage_url)}: study {study.study_name!r} is not a fusiontune study (no"
        f" {STUDY_INFO_KEY!r} user attribute); nothing was written"
    )


def load_study_frame(storage_url: str, study_name: str | None) -> pd.DataFrame:
    """One row per trial of a study, everything taken from its storage.

    Args:
        storage_url: a SQLAlchemy URL.
        study_name: the study (None: the only one in the storage).

    Returns:
        Columns: ``number``, ``state``, ``role``, every ``pass.*`` switch (every switchable pass,
        "on"/"off") and ``split.*`` point (int), ``median_s``, ``iqr_s``, ``cv``, ``min_s``, every
        error metric, ``error`` (the bounded metric), ``constraint`` (``error - bound``),
        ``feasible``, ``speedup_vs_defaults``, ``speedup_vs_all_off``, ``program_hash``,
        ``reused_from``, ``kernels``, ``compile_s``, ``node``, ``config_key``, ``error_msg``,
        ``datetime_start``, ``datetime_complete``; sorted by trial number.

    Raises:
        UserError: see :func:`open_study`.
    """
    return study_frame(open_study(storage_url, study_name))


def command_target(study: Any) -> dict[str, Any] | None:
    """The study's command target record (``CommandTarget.to_json()``), None for a built-in workload."""
    target = StudyStore(study).info().target
    return dict(target) if target is not None else None


def param_columns(study: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``pass.*`` and ``split.*`` columns of the study's table.

    The registry's for a built-in workload; for a command target, the switchable passes of the
    job's table (from the study attr ``target``) and no split points.
    """
    target = command_target(study)
    if target is None:
        return SWITCH_COLUMNS, SPLIT_COLUMNS
    passes = dict(target.get("passes") or {})
    fixed = set(passes.get("not_switchable") or ())
    names = [n for kind in ("GraphFusion", "UBFusion") for n in passes.get(kind) or () if n not in fixed]
    return tuple(f"pass.{n}" for n in names), ()


def study_frame(study: Any) -> pd.DataFrame:
    """The table of :func:`load_study_frame` for an already loaded ``optuna.Study``.

    Speedups are against each trial's own baseline (the :class:`~fusiontune.tune.store.Baseline`
    measured in the same window, on the same node); a study of the first version, which has no
    baseline records, falls back to its defaults and all-off trials. The ranked feasible trials
    come first, in the order of :func:`ranking`, then every other trial by number.
    """
    store = StudyStore(study)
    info = store.info()
    switch_cols, split_cols = param_columns(study)
    command = info.target is not None  # the job's own numbers: no kernels, one error
    records = store.trials()
    found = store.baselines()
    baselines = {b.id: b for b in found}
    speed = speedups(records, found)
    rows = [
        _trial_row(t, info.metric, info.bound, switch_cols, split_cols, command, baselines, speed[t.number])
        for t in records
    ]
    metrics = () if command else METRICS
    measured = [c for c in _MEASURED if c in ("median_s", "iqr_s", "cv", "min_s") or c not in METRICS or c in metrics]
    # A command target's job runs `repeats` times, fewer when racing stopped it (measure/racing.py).
    raced = ["runs", "raced_out"] if command else []
    columns = [*_LEAD, *switch_cols, *split_cols, *measured, *raced, *_TAIL]
    frame = pd.DataFrame(rows, columns=columns).sort_values("number", kind="stable")
    frame = frame.reset_index(drop=True)
    for col in split_cols + ("reused_from", "kernels"):
        frame[col] = frame[col].astype("Int64")
    for col in ("feasible", "noisy", *raced[1:]):
        frame[col] = frame[col].astype(bool)
    return _ranked_first(frame, store.confirmation())


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _finite_or_nan(value: Any) -> float:
    v = _float(value)
    return v if math.isfinite(v) else math.nan


def _trial_row(
    trial: TrialRecord,
    metric: str,
    bound: float,
    switch_cols: Sequence[str],
    split_cols: Sequence[str],
    command: bool,
    baselines: Mapping[str, Baseline],
    speedup: tuple[float, float],
) -> dict[str, Any]:
    result = trial.result
    ok = result is not None and result.ok
    config = trial.config
    row: dict[str, Any] = {
        "number": trial.number,
        "state": trial.state,
        "role": trial.role,
        "status": trial.status.value,
    }
    # The resolved config has every pass; the params only the searched ones (same values).
    switches = {} if config is None else dict(config.switches)
    points = {} if config is None else dict(config.split_points)
    for col in switch_cols:
        name = col.removeprefix("pass.")
        value = trial.params.get(col)
        if value is None and name in switches:
            value = "on" if switches[name] else "off"
        row[col] = value
    for col in split_cols:
        value = trial.params.get(col, points.get(col.removeprefix("split.")))
        row[col] = None if value is None else int(value)
    for name in METRICS:
        row[name] = result.error(name) if ok and result is not None and result.errors is not None else math.nan
    # The bounded metric: one of METRICS, or a command target's "error".
    row["error"] = _finite_or_nan(result.error(metric)) if ok and result is not None else math.nan
    for name in ("median_s", "iqr_s", "cv", "min_s", "ci_low_s", "ci_high_s"):
        row[name] = _finite_or_nan(getattr(result, name)) if ok else math.nan
    row["noisy"] = bool(ok and result is not None and result.noisy)
    row["runs"] = result.runs if result is not None else 0
    row["raced_out"] = bool(result is not None and result.raced_out)
    row["constraint"] = trial.constraint if trial.constraint is not None else row["error"] - bound
    row["feasible"] = trial.feasible and not math.isnan(row["median_s"])
    row["speedup_vs_defaults"], row["speedup_vs_all_off"] = speedup
    base = baselines.get(trial.baseline)
    row.update(
        baseline=trial.baseline,
        baseline_defaults_s=base.defaults_s if base is not None else math.nan,
        baseline_all_off_s=base.all_off_s if base is not None else math.nan,
        program_hash=trial.program_hash,
        reused_from=trial.reused_from,
        kernels=result.kernels if ok and result is not None and not command else None,
        compile_s=result.compile_s if result is not None else math.nan,
        node=result.node if result is not None else "",
        config_key=result.config_key if result is not None else (config.key() if config else ""),
        error_msg=(result.error_msg if result is not None else "")
        or trial.interrupted
        or _missing_result(trial),
        datetime_start=_iso(trial.datetime_start),
        datetime_complete=_iso(trial.datetime_complete),
    )
    return row


def _missing_result(trial: TrialRecord) -> str:
    if trial.result is not None:
        return ""
    if trial.state in ("RUNNING", "WAITING"):
        return "no result recorded (in flight, or the sweep was killed)"
    return "no result recorded"


def _iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else ""


# ---- the one ranking -------------------------------------------------------------------------------
def _ranked_first(frame: pd.DataFrame, confirmation: Confirmation | None) -> pd.DataFrame:
    """Add ``rank``, ``ranked_by``, ``confirmed_median_s`` and put the ranked trials first."""
    order, why, confirmed = _ranking_order(frame, confirmation)
    frame["confirmed_median_s"] = frame["number"].map(confirmed).astype(float)
    frame["rank"] = pd.array([None] * len(frame), dtype="Int64")
    frame["ranked_by"] = ""
    position = {n: i for i, n in enumerate(order)}
    for idx, number in frame["number"].items():
        if number in position:
            frame.at[idx, "rank"] = position[number] + 1
            frame.at[idx, "ranked_by"] = why[number]
    key = frame["number"].map(lambda n: position.get(n, len(order) + n))
    frame = frame.iloc[key.argsort(kind="stable")].reset_index(drop=True)
    lead = ["rank", "ranked_by", *[c for c in frame.columns if c not in ("rank", "ranked_by")]]
    return frame[lead]


def _ranking_order(
    frame: pd.DataFrame, confirmation: Confirmation | None
) -> tuple[list[int], dict[int, str], dict[int, float]]:
    """The one order every table shows: the recommendation first, then confirmed, then the sweep.

    1. The recommended trial: the confirmation's winner, or, when nothing was distinguishable,
       the defaults it measured.
    2. The other configurations the confirmation measured and found within the bound, by their
       confirmed median.
    3. Every other feasible trial, by its speedup against its own baseline (so trials measured in
       different windows compare fairly), then by median.
    """
    feasible = frame[frame["feasible"]]
    numbers = set(int(n) for n in feasible["number"])
    order: list[int] = []
    why: dict[int, str] = {}
    confirmed: dict[int, float] = {}
    if confirmation is not None:
        rows = [r for r in confirmation.rows if r.feasible]
        for r in confirmation.rows:
            confirmed[r.trial] = r.median_s
        first = confirmation.winner_trial if confirmation.distinguishable else confirmation.defaults_trial
        for r in sorted(rows, key=lambda r: (r.trial != first, r.median_s, r.trial)):
            if r.trial not in numbers and r.trial != first:
                continue
            order.append(r.trial)
            if r.trial == first and confirmation.distinguishable:
                why[r.trial] = "recommended: confirmed, CI below the defaults'"
            elif r.trial == first:
                why[r.trial] = "recommended: nothing confirmed distinguishable from the defaults"
            else:
                why[r.trial] = "confirmed median"
    rest = feasible[~feasible["number"].isin(order)].copy()
    rest["_speed"] = rest["speedup_vs_defaults"].fillna(-math.inf)
    rest = rest.sort_values(["_speed", "median_s", "number"], ascending=[False, True, True], kind="stable")
    for number in rest["number"]:
        order.append(int(number))
        why[int(number)] = "sweep: speedup vs its baseline"
    if confirmation is None and order:
        why[order[0]] = "recommended: fastest in the sweep (not confirmed)"
    return order, why, confirmed


def ranked(frame: pd.DataFrame) -> pd.DataFrame:
    """The ranked trials (feasible, and the recommendation), in the one order (column ``rank``)."""
    return frame[frame["rank"].notna()].sort_values("rank", kind="stable").reset_index(drop=True)


def best_so_far(frame: pd.DataFrame) -> pd.Series:
    """The best feasible median after each trial, by trial number (NaN before the first)."""
    by_number = frame.sort_values("number", kind="stable")
    best = by_number["median_s"].where(by_number["feasible"]).cummin().ffill()
    return pd.Series(best.to_numpy(), index=by_number["number"].to_numpy(), name="best_so_far_s")


def baseline_median(frame: pd.DataFrame, role: str) -> float | None:
    """Median runtime of the first measured trial with ``role`` (defaults / all_off), or None."""
    rows = frame[
        (frame["role"] == role) & frame["median_s"].notna() & (frame["state"] == "COMPLETE")
    ].sort_values("number")
    return float(rows["median_s"].iloc[0]) if len(rows) else None


def baseline_trial(frame: pd.DataFrame, role: str) -> int | None:
    """Number of the first completed trial with ``role``, or None."""
    rows = frame[(frame["role"] == role) & (frame["state"] == "COMPLETE")].sort_values("number")
    return int(rows["number"].iloc[0]) if len(rows) else None


def pareto_front(frame: pd.DataFrame) -> pd.DataFrame:
    """Completed trials no other trial beats in both runtime and error, by runtime."""
    done = frame[frame["median_s"].notna() & frame["error"].notna()]
    done = done.sort_values(["median_s", "error", "number"], kind="stable")
    keep, best_error = [], math.inf
    for idx, err in zip(done.index, done["error"], strict=True):
        if err < best_error:
            keep.append(idx)
            best_error = err
    return done.loc[keep]


def searched_params(study: Any) -> list[str]:
    """The ``pass.*`` and ``split.*`` parameters the study searched, in table order."""
    names = {name for t in study.get_trials(deepcopy=False) for name in t.params}
    switch_cols, split_cols = param_columns(study)
    return [c for c in (*switch_cols, *split_cols) if c in names]


def pass_effect(frame: pd.DataFrame, searched: Sequence[str] | None = None) -> pd.DataFrame:
    """For every searched pass switched both ways: median speedup with it on vs off.

    Speedups are against the defaults; every measured trial counts, feasible or not (the
    effect on runtime is what this shows; the error is a separate axis).

    Args:
        frame: the study table.
        searched: the searched parameters (:func:`searched_params`); None: every pass column
            (then a pass held fixed differs only in the all-off baseline and shows that).

    Returns:
        Columns ``pass``, ``on`` and ``off`` (median speedup), ``n_on``, ``n_off``, ``ratio``
        (on / off: above 1 the pass helps), sorted by ratio, largest first.
    """
    measured = frame[frame["speedup_vs_defaults"].notna()]
    rows = []
    for col in [c for c in frame.columns if c.startswith("pass.")]:
        if searched is not None and col not in searched:
            continue
        on = measured.loc[measured[col] == "on", "speedup_vs_defaults"]
        off = measured.loc[measured[col] == "off", "speedup_vs_defaults"]
        if len(on) and len(off):
            rows.append(
                {
                    "pass": col.removeprefix("pass."),
                    "on": float(on.median()),
                    "off": float(off.median()),
                    "n_on": len(on),
                    "n_off": len(off),
                    "ratio": float(on.median() / off.median()),
                }
            )
    out = pd.DataFrame(rows, columns=["pass", "on", "off", "n_on", "n_off", "ratio"])
    return out.sort_values("ratio", ascending=False, kind="stable").reset_index(drop=True)


def accuracy_attribution(
    frame: pd.DataFrame, effect: pd.DataFrame | None = None, searched: Sequence[str] | None = None
) -> pd.DataFrame:
    """For each inexact pass: the error with only it on, and the median speedup it brings.

    The error comes from the ``only:<Pass>`` trial the sweep enqueues (the defaults with that one
    inexact pass on); the speedup is the pass's on/off ratio of median speedups over the sweep
    (:func:`pass_effect`), NaN when it was not switched both ways in measured trials.

    Returns:
        Columns ``pass``, ``expected`` (the registry's declared error), ``error`` (NaN when the
        trial is missing or failed), ``feasible``, ``trial``, ``speedup``, ``n_on``, ``n_off``;
        one row per inexact pass that was searched (``searched``; None: every pass column) or has
        an ``only:`` trial, in registry order.
    """
    effect = pass_effect(frame, searched) if effect is None else effect
    by_pass = {r["pass"]: r for r in effect.to_dict("records")}
    rows = []
    for p in PASSES:
        col = f"pass.{p.name}"
        only = frame[(frame["role"] == f"only:{p.name}") & (frame["state"] == "COMPLETE")].sort_values("number")
        tried = col in frame.columns and (searched is None or col in searched)
        if p.exact or not (tried or (frame["role"] == f"only:{p.name}").any()):
            continue
        eff = by_pass.get(p.name)
        rows.append(
            {
                "pass": p.name,
                "expected": p.expected_error,
                "error": float(only["error"].iloc[0]) if len(only) else math.nan,
                "feasible": bool(only["feasible"].iloc[0]) if len(only) else False,
                "trial": int(only["number"].iloc[0]) if len(only) else None,
                "speedup": eff["ratio"] if eff else math.nan,
                "n_on": eff["n_on"] if eff else 0,
                "n_off": eff["n_off"] if eff else 0,
            }
        )
    columns = ["pass", "expected", "error", "feasible", "trial", "speedup", "n_on", "n_off"]
    return pd.DataFrame(rows, columns=columns)


# ---- parameter importance ----------------------------------------------------------------------------------
def importance_evaluator(study: Any) -> tuple[Any, str]:
    """fANOVA (seeded) when scikit-learn is installed, else PED-ANOVA (optuna alone).

    Returns:
        (a fresh evaluator, its name for the report).
    """
    import optuna

    try:
        import sklearn  # noqa: F401
    except ImportError:
        complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
        # PED-ANOVA compares the top quantile with the rest: keep about 5 trials in the top.
        quantile = min(0.5, max(0.1, 5 / max(complete, 1)))
        return optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile), "PED-ANOVA"
    return optuna.importance.FanovaImportanceEvaluator(seed=0), "fANOVA"


def param_importance(
    study: Any, params: Sequence[str] | None = None
) -> tuple[dict[str, float] | None, str, Any]:
    """optuna's importance of each searched parameter for the median runtime.

    Args:
        study: the ``optuna.Study``.
        params: the parameters to explain (:func:`effective_params`: those of passes that matched
            in the workload); None: every searched one.

    Returns:
        (parameter -> importance, largest first, or None; the method used, or one sentence
        saying why none was computed; the target given to optuna: ``values[0]`` for a
        two-objective study, else None).
    """
    import optuna

    target = (lambda t: t.values[0]) if len(study.directions) > 1 else None
    complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if complete < MIN_IMPORTANCE_TRIALS:
        return (
            None,
            (
                f"Parameter importance not computed: it needs at least {MIN_IMPORTANCE_TRIALS} "
                f"completed trials, the study has {complete}."
            ),
            target,
        )
    if params is not None and not params:
        return None, "Parameter importance not computed: no searched pass matched in the workload.", target
    evaluator, method = importance_evaluator(study)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few-trial warnings: the table says what it is
            found = optuna.importance.get_param_importances(
                study, evaluator=evaluator, target=target, params=list(params) if params else None
            )
    except Exception as exc:  # too few trials, a single value per param: say so, go on
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"Parameter importance not computed: {reason}", target
    if not found:
        return (
            None,
            "Parameter importance not computed: the study has no searched parameters.",
            target,
        )
    return dict(found), method, target


# ---- passes that matched -------------------------------------------------------------------------
def matched_passes(study: Any) -> set[str] | None:
    """The passes that matched at least once in some trial's workload.

    From each result's fusion report (the pipeline's ``matched_times``, or what a command
    target's job reported through ``fusion_result.json`` or its log lines). None when no trial
    reported any fusion statistics: then nothing is known, and nothing is left out.
    """
    reports = [t.result.fusion for t in StudyStore(study).trials() if t.result is not None]
    if not any(r.stats for r in reports):
        return None
    return {s.pass_name for r in reports for s in r.stats if s.matched_times > 0}


def param_pass(param: str) -> str:
    """The pass a parameter belongs to: ``pass.X`` and ``split.X.point`` -> ``X``."""
    return param.split(".")[1]


def effective_params(study: Any, searched: Sequence[str]) -> tuple[list[str], list[str]]:
    """The searched parameters whose pass matched in the workload, and the passes that never did.

    A pass that never matched changes nothing whichever way it is switched: crediting it with an
    effect or an importance would only rank noise. Those are listed by name instead.

    Returns:
        (parameters to rank, names of searched passes that never matched).
    """
    matched = matched_passes(study)
    if matched is None:
        return list(searched), []
    keep = [p for p in searched if param_pass(p) in matched]
    never = sorted({param_pass(p) for p in searched if param_pass(p) not in matched})
    return keep, never


# ---- text ----------------------------------------------------------------------------------------
def fmt_seconds(value: Any) -> str:
    """A duration in the unit that suits it: ``812 ns``, ``45.3 us``, ``1.27 ms``, ``2.05 s``."""
    v = _float(value)
    if math.isnan(v):
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v / 1e-9:.3g} ns"


def fmt_speedup(value: Any) -> str:
    v = _float(value)
    return "-" if math.isnan(v) else f"{v:.2f}x"


def fmt_number(value: Any) -> str:
    v = _float(value)
    return "-" if math.isnan(v) else f"{v:.3g}"


def top_rows(frame: pd.DataFrame, n: int = 10) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the first ``n`` of the one ranking (:func:`ranked`)."""
    headers = [
        "rank",
        "trial",
        "median",
        "IQR",
        "confirmed",
        "vs defaults",
        "vs all-off",
        "error",
        "kernels",
        "ranked by",
        "note",
    ]
    rows = []
    for r in ranked(frame).head(n).itertuples(index=False):
        note = [r.role] if r.role else []
        if not pd.isna(r.reused_from):
            note.append(f"reuses #{r.reused_from}")
        if r.noisy:
            note.append(f"noisy: CV {r.cv:.2f}")
        if getattr(r, "raced_out", False):
            note.append(f"raced out after {r.runs} run{'s' if r.runs != 1 else ''}")
        rows.append(
            [
                str(r.rank),
                str(r.number),
                fmt_seconds(r.median_s),
                fmt_seconds(r.iqr_s),
                fmt_seconds(r.confirmed_median_s),
                fmt_speedup(r.speedup_vs_defaults),
                fmt_speedup(r.speedup_vs_all_off),
                fmt_number(r.error),
                "-" if pd.isna(r.kernels) else str(r.kernels),
                r.ranked_by,
                ", ".join(note),
            ]
        )
    return headers, rows


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, a dashed rule under the header."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_top(frame: pd.DataFrame, n: int = 10) -> str:
    """The ranked top ``n`` feasible configurations as a table for the terminal.

    Args:
        frame: the table of :func:`load_study_frame`.
        n: how many rows.

    Returns:
        The table, or one sentence when no trial is feasible.
    """
    headers, rows = top_rows(frame, n)
    if not rows:
        return "no feasible configuration yet (every finished trial failed or broke the bound)"
    return text_table(headers, rows)
