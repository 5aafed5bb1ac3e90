"""CommandEvaluator: tune the user's real job (an ATC conversion plus inference, a MindSpore script).

Each request runs the job of the space's ``[target]`` (:class:`CommandTarget`) in a folder of its
own, ``<base>/<trial number>/`` (``results/<study>/trials/<n>/`` for a sweep,
``results/<name>/bisect/<n>/`` for a bisection), which holds afterwards:

- ``fusion_switch.cfg``: the configuration in CANN's JSON form, with the job's pass names;
- ``graph_kernel_flags.txt``: the same as MindSpore flags (``--enable_pass=... --disable_pass=...``);
- ``config.json``: the configuration as ``best_config.json``;
- ``stdout.log``, ``stderr.log`` (``stdout.2.log`` ... for further repeats): capped at 1 MiB each;
- ``result.json``: the command line, each run's exit code, wall time and metrics, the reason of a
  failure or of an early stop (``raced_out``), the fusion statistics; ``metrics.json``: the
  metrics alone.

Racing: a request with ``race_against`` (the incumbent's runtimes, from the tuning loop) stops
repeating the job as soon as the runs made are clearly slower than the incumbent
(:func:`fusiontune.measure.racing.clearly_worse`, a look after each run from the second on), and
one with a finite ``race_bound`` once a run's error is above it (the error is the maximum over
the runs, so no further run can bring it back under). The result is ``ok`` with the median of the
runs made, ``runs`` and ``raced_out`` set.

The placeholders of the command, its environment and its working directory are filled from these
files (:data:`fusiontune.workloads.target.PLACEHOLDERS`). A non-zero exit, a timeout (the job's
whole process group is killed, and every process it started, a daemonized one too: see
:mod:`~fusiontune.tune._job_process`), a start failure, or output without the metrics, or with a
metric the job cannot have (a runtime not finite and > 0, an error not finite and >= 0), is a
failed result whose message names the reason and the log; the sweep goes on. Fusion statistics come
from a ``fusion_result.json`` the job leaves in the trial folder (or, written during the run, in
its working directory), else from GE log lines with ``matched_times`` / ``effected_times``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusiontune.config.flags import render_flags
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.switch_file import dump_switch_json
from fusiontune.measure import MeasureConfig, Timing, is_noisy
from fusiontune.measure.racing import clearly_worse
from fusiontune.passes.base import FusionReport
from fusiontune.tune._job_output import (
    MetricError,
    extra_metrics,
    fusion_from_log,
    fusion_from_result_file,
    last_json_object,
    last_line,
    read_metric,
    read_text,
)
from fusiontune.tune._job_process import LOG_CAP_BYTES, TERM_GRACE_S, ProcessOutcome, run_process
from fusiontune.tune.records import OK, RUN_FAILED, EvalRequest, EvalResult, EvalStatus, request_key
from fusiontune.workloads.target import CommandTarget, render

SWITCH_FILE = "fusion_switch.cfg"
FLAGS_FILE = "graph_kernel_flags.txt"
CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
METRICS_FILE = "metrics.json"
FUSION_RESULT = "fusion_result.json"


@dataclass(frozen=True)
class PreparedTrial:
    """A trial folder with the configuration written, and the job's command line filled in."""

    trial_dir: Path
    command: tuple[str, ...] | str
    env_overrides: dict[str, str]
    cwd: Path


def prepare_trial(target: CommandTarget, config: FusionConfig, trial_dir: Path) -> PreparedTrial:
    """Empty ``trial_dir``, write the configuration's files there, fill in the placeholders.

    A folder left by an earlier run under the same number is emptied first: a stale
    ``fusion_result.json`` must not be read as this run's.
    """
    trial_dir = trial_dir.resolve()
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    trial_dir.mkdir(parents=True)
    switch_file = trial_dir / SWITCH_FILE
    switch_file.write_text(dump_switch_json(config), encoding="utf-8")
    flags = render_flags(config)
    (trial_dir / FLAGS_FILE).write_text(flags + "\n", encoding="utf-8")
    config_json = trial_dir / CONFIG_FILE
    config_json.write_text(json.dumps(config.to_json(), indent=4) + "\n", encoding="utf-8")
    values = {
        "switch_file": str(switch_file),
        "graph_kernel_flags": flags,
        "config_json": str(config_json),
        "trial_dir": str(trial_dir),
        "python": sys.executable,
    }
    command: tuple[str, ...] | str
    if isinstance(target.command, str):
        command = render(target.command, values, shlex.quote)
    else:
        command = tuple(render(word, values) for word in target.command)
    env = {name: render(value, values) for name, value in target.env}
    cwd = Path(target.base_dir) / render(target.workdir, values)
    return PreparedTrial(trial_dir, command, env, cwd)


def run_command_trial(
    target: CommandTarget,
    request: EvalRequest,
    trial_dir: str | os.PathLike[str],
    node: str = "",
    term_grace_s: float = TERM_GRACE_S,
    cap_bytes: int = LOG_CAP_BYTES,
) -> EvalResult:
    """Run the job for one request (``target.repeats`` times; once when ``request.timing`` is False).

    Args:
        target: the job.
        request: the configuration; ``request.trial`` only names the result.
        trial_dir: the trial's folder (emptied first).
        node: where it runs (default: the host name).
        term_grace_s: seconds between SIGTERM and SIGKILL on a timeout.
        cap_bytes: the cap of each log file.

    Returns:
        ``ok`` with the median runtime of the runs, the largest error (``errors["error"]``) and
        the fusion statistics; or ``failed`` with the reason and the log path. Never raises for
        the job's own failure. The runs stop early when the request races
        (``race_against``, ``race_bound``: see the module docstring).
    """
    host = socket.gethostname()
    node = node or host
    key = request_key(request.config, request.deny)
    path = Path(trial_dir)
    if request.deny:  # bisection's step 2 needs applications, which a job does not report
        return EvalResult(request.trial, key, "", RUN_FAILED, "a command target cannot deny single applications", node=node)
    try:
        prepared = prepare_trial(target, request.config, path)
    except OSError as exc:
        return EvalResult(request.trial, key, "", RUN_FAILED, f"cannot prepare the trial folder {path}: {exc}", node=node)
    env = {**os.environ, **prepared.env_overrides}
    runs = target.repeats if request.timing else 1
    records: list[dict[str, Any]] = []
    runtimes: list[float] = []
    errors: list[float] = []
    metrics: dict[str, float] = {}
    reason = ""
    raced_out = ""
    status = EvalStatus.OK
    started = time.time()
    stdout_text = stderr_text = ""
    for i in range(runs):
        suffix = "" if i == 0 else f".{i + 1}"
        out_path = prepared.trial_dir / f"stdout{suffix}.log"
        err_path = prepared.trial_dir / f"stderr{suffix}.log"
        outcome = run_process(
            prepared.command, prepared.cwd, env, target.timeout_s, out_path, err_path,
            shell=target.shell, cap_bytes=cap_bytes, term_grace_s=term_grace_s,
        )
        stdout_text, stderr_text = read_text(out_path), read_text(err_path)
        record: dict[str, Any] = {
            "run": i + 1,
            "exit_code": outcome.returncode,
            "timed_out": outcome.timed_out,
            "wall_s": round(outcome.wall_s, 6),
            "pgid": outcome.pgid,
            "stdout": str(out_path),
            "stderr": str(err_path),
            "stdout_bytes": outcome.stdout_bytes,
            "stderr_bytes": outcome.stderr_bytes,
        }
        records.append(record)
        which = f" (run {i + 1} of {runs})" if runs > 1 else ""
        reason = _process_failure(outcome, target, stdout_text, stderr_text, out_path, err_path, which)
        status = EvalStatus.TIMEOUT if outcome.timed_out else EvalStatus.RUN_FAILED
        if not reason:
            data = last_json_object(stdout_text)
            try:
                runtime = read_metric(target.runtime, stdout_text, data)
                error = read_metric(target.error, stdout_text, data)
            except MetricError as exc:
                reason = f"{exc}{which}; log: {out_path}"
            else:
                metrics = extra_metrics(data)
                record.update(runtime_s=runtime, error=error, reported=metrics)
                runtimes.append(runtime)
                errors.append(error)
                raced_out = _race_stop(request, node, runtimes, error, runs)
        if reason:
            record["reason"] = reason
            break
        if raced_out:
            record["raced_out"] = raced_out
            break
    kinds = {p.name: str(p.kind) for p in request.config.pass_rows()}
    fusion, fusion_source = _fusion_stats(prepared, started, stdout_text, stderr_text, kinds)
    extra: dict[str, Any] = {
        "trial_dir": str(prepared.trial_dir),
        "log": records[-1]["stdout"] if records else "",
        "exit_codes": [r["exit_code"] for r in records],
        "host": host,
        "wall_s": round(sum(r["wall_s"] for r in records), 6),
    }
    if metrics:
        extra["metrics"] = metrics
    if raced_out:
        extra["raced_out"] = raced_out
    if fusion_source:
        extra["fusion_source"] = fusion_source
    if reason:
        result = EvalResult(
            request.trial, key, "", status, reason, runs=len(records), node=node, fusion=fusion, extra=extra
        )
    else:
        result = _ok_result(request, key, runtimes, errors, metrics, node, fusion, extra)
        result = dataclasses.replace(result, runs=len(records), raced_out=bool(raced_out))
    _write_record(prepared, request, result, records)
    return result


def _race_stop(
    request: EvalRequest, node: str, runtimes: Sequence[float], error: float, runs: int
) -> str:
    """Why the job's repeats stop after this run, or "" to go on."""
    done = len(runtimes)
    if done >= runs:
        return ""
    if error > request.race_bound:  # the maximum over the runs can only grow
        return f"error {error:.3g} above the bound {request.race_bound:g} after {done} of {runs} runs"
    if request.race_against and (not request.race_node or request.race_node == node):
        try:
            decision = clearly_worse(runtimes, request.race_against, runs)
        except ValueError:  # an incumbent with a runtime that is not > 0: no race
            return ""
        if decision.stop:
            return decision.describe()
    return ""


def _process_failure(
    outcome: ProcessOutcome,
    target: CommandTarget,
    stdout: str,
    stderr: str,
    out_path: Path,
    err_path: Path,
    which: str,
) -> str:
    """Why a run failed as a process (start, timeout, exit status), or "" when it exited 0."""
    said = last_line(stderr) or last_line(stdout)
    said = f": {said}" if said else ""
    if outcome.start_error:
        return f"{outcome.start_error}{which}; log: {err_path}"
    if outcome.timed_out:
        return (
            f"timed out after {target.timeout_s:g} s{which}: the job's process group was killed;"
            f" log: {out_path}"
        )
    code = outcome.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the job was killed by {name}{which}{said}; log: {err_path}"
    if code:
        return f"the job exited with code {code}{which}{said}; log: {err_path}"
    return ""


def _fusion_stats(
    prepared: PreparedTrial, started: float, stdout: str, stderr: str, kinds: Mapping[str, str]
) -> tuple[FusionReport, str]:
    """The job's fusion statistics and where they came from ("" when it reported none)."""
    counts, source = _fusion_counts(prepared, started, stdout, stderr)
    return FusionReport.from_counts(counts, kinds), source


def _fusion_counts(
    prepared: PreparedTrial, started: float, stdout: str, stderr: str
) -> tuple[dict[str, tuple[int, int]], str]:
    candidates = [prepared.trial_dir / FUSION_RESULT]
    in_cwd = prepared.cwd / FUSION_RESULT
    try:  # ATC writes it into its working directory: take it only if this run wrote it
        if in_cwd.resolve() != candidates[0] and in_cwd.stat().st_mtime >= started - 1.0:
            candidates.append(in_cwd)
    except OSError:
        pass
    for path in candidates:
        if path.is_file():
            try:
                return fusion_from_result_file(path), str(path)
            except Exception:  # a half-written or foreign file: fall back to the log lines
                continue
    found = fusion_from_log(stdout, stderr)
    return found, ("log lines" if found else "")


def _ok_result(
    request: EvalRequest,
    key: str,
    runtimes: Sequence[float],
    errors: Sequence[float],
    metrics: Mapping[str, float],
    node: str,
    fusion: FusionReport,
    extra: dict[str, Any],
) -> EvalResult:
    """Runtime: the median of the runs; error: the largest (the bound must hold on every run)."""
    reported = {**{k: float(v) for k, v in metrics.items()}, "error": max(errors)}
    if not request.timing:  # accuracy only (bisection): the run's time is kept in extra
        extra = {**extra, "runtime_s": runtimes[0]}
        return EvalResult(
            request.trial, key, "", OK, reported=reported, node=node, fusion=fusion,
            median_s=math.nan, iqr_s=math.nan, cv=math.nan, min_s=math.nan, attempts=1, extra=extra,
        )
    t = Timing.from_samples(tuple(runtimes), 1)
    # The job's own runs are its samples; with 3 or more, a spread above the default limits of
    # MeasureConfig (CV 10%, IQR 10% of the median) flags the trial, as a kernel's timing would be.
    noisy = len(runtimes) >= 3 and is_noisy(t, MeasureConfig())
    return EvalResult(
        request.trial, key, "", OK, median_s=t.median_s, iqr_s=t.iqr_s, cv=t.cv, min_s=t.min_s,
        samples_s=t.samples_s, ci_low_s=t.ci_low_s, ci_high_s=t.ci_high_s, noisy=noisy, attempts=1,
        reported=reported, node=node, fusion=fusion, extra=extra,
    )


def _write_record(
    prepared: PreparedTrial, request: EvalRequest, result: EvalResult, runs: list[dict[str, Any]]
) -> None:
    command = prepared.command if isinstance(prepared.command, str) else list(prepared.command)
    record = {
        "trial": request.trial,
        "config_key": result.config_key,
        "status": result.status.value,
        "reason": result.error_msg,
        "command": command,
        "cwd": str(prepared.cwd),
        "env": prepared.env_overrides,
        "runs": runs,
        "raced_out": result.extra.get("raced_out", ""),
        "runtime_s": None if not math.isfinite(result.median_s) else result.median_s,
        "error": result.reported.get("error"),
        "fusion": {
            name: {"matched_times": m, "effected_times": e} for name, (m, e) in result.fusion.counts().items()
        },
        "node": result.node,
    }
    try:
        (prepared.trial_dir / RESULT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        metrics = {
            "runtime_s": record["runtime_s"],
            "error": record["error"],
            "reported": result.extra.get("metrics", {}),
        }
        (prepared.trial_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    except OSError:  # the result itself is what counts; the folder may have been removed
        pass


class CommandEvaluator:
    """Runs the user's job in this process's machine, one request after another.

    Args:
        target: the job (a command space's ``target``).
        base_dir: trial folders go to ``base_dir/<request.trial>/``.
        term_grace_s: seconds between SIGTERM and SIGKILL on a timeout.
        cap_bytes: the cap of each log file.
    """

    workers = 0

    def __init__(
        self,
        target: CommandTarget,
        base_dir: str | os.PathLike[str],
        term_grace_s: float = TERM_GRACE_S,
        cap_bytes: int = LOG_CAP_BYTES,
    ) -> None:
        self.target = target
        self.base_dir = Path(base_dir).resolve()
        self.term_grace_s = term_grace_s
        self.cap_bytes = cap_bytes
        self._unnumbered = itertools.count()

    def trial_dir(self, request: EvalRequest) -> Path:
        """``base_dir/<trial>``; a request outside a study's trials gets ``base_dir/<label>``, or
        ``base_dir/run-<k>`` without one."""
        name = request.folder_name() or f"run-{next(self._unnumbered)}"
        return self.base_dir / name

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        return [
            run_command_trial(
                self.target, r, self.trial_dir(r), term_grace_s=self.term_grace_s, cap_bytes=self.cap_bytes
            )
            for r in requests
        ]

    def close(self) -> None:
        return None
