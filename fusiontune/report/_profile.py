"""The report's "Where the time goes" section: the kernel profile of the recommended configuration.

A report is built from records, never from a live measurement (DESIGN.md section 11). The
profile is therefore a record of its own, ``results/<study>/profile.json``: measured on request
(``fusiontune report RESULTS_DIR --profile``, or ``write_report(..., profile=True)``) for the
recommended configuration of a built-in workload or ONNX model (a command target's job has no
kernels fusiontune can time), and read by every later rebuild. The section is shown when that
file exists and is of the configuration recommended now; a profile of an older recommendation is
named, not shown; without the file there is no section, so a folder without one (the committed
``results/example``) rebuilds byte for byte.

Why at report time rather than in the confirmation: the recommendation is only final once the
report has chosen it, the profile needs one process with the program's buffers (any node that
can build the workload), and a stored file keeps rebuilds from measuring again.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fusiontune.errors import UserError
from fusiontune.report._render import Block

PROFILE_FILE = "profile.json"
TOP_KERNELS = 20
"""Kernels listed in the report's table; the others are summed in one row."""


@dataclass(frozen=True)
class StoredProfile:
    """``profile.json``: whose profile it is, where and when it was taken, and the profile.

    Attributes:
        config_key: the configuration profiled (``FusionConfig.key()``).
        trial: the recommended trial it was taken for (None: the defaults, no trial).
        workload: the workload's name.
        sizes: its sizes.
        host: the machine's hostname.
        time: when it was measured (ISO 8601, UTC).
        profile: the record of :func:`fusiontune.measure.profile.profile_program`.
    """

    config_key: str
    trial: int | None
    workload: str
    sizes: Mapping[str, int]
    host: str
    time: str
    profile: Any = field(repr=False)  # a ProfileReport (imported lazily)

    def to_json(self) -> dict[str, Any]:
        return {
            "config_key": self.config_key,
            "trial": self.trial,
            "workload": self.workload,
            "sizes": dict(self.sizes),
            "host": self.host,
            "time": self.time,
            "profile": self.profile.to_json(),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> StoredProfile:
        from fusiontune.measure.profile import ProfileReport

        trial = d.get("trial")
        return StoredProfile(
            config_key=str(d["config_key"]),
            trial=None if trial is None else int(trial),
            workload=str(d.get("workload", "")),
            sizes={str(k): int(v) for k, v in dict(d.get("sizes") or {}).items()},
            host=str(d.get("host", "")),
            time=str(d.get("time", "")),
            profile=ProfileReport.from_json(d["profile"]),
        )


def load_profile(out: Path) -> StoredProfile | None:
    """The profile stored in ``out``, or None when there is none.

    Raises:
        UserError: the file exists but is not a profile record.
    """
    path = out / PROFILE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return StoredProfile.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{path}: not a kernel profile ({type(e).__name__}: {e}); delete it, or measure again"
            " with `fusiontune report --profile`"
        ) from None


def measure_profile(
    info: Any, config: Any, trial: int | None, out: Path, target: Mapping[str, Any] | None
) -> Path:
    """Build the study's workload under ``config``, profile it, and write ``profile.json``.

    Args:
        info: the study's :class:`~fusiontune.tune.store.StudyInfo`.
        config: the recommended configuration.
        trial: its trial number (None for the defaults without a trial).
        out: the results folder.
        target: the study's command target, if any.

    Returns:
        The file written.

    Raises:
        UserError: a command target's study, or a workload that cannot be built here.
    """
    if target is not None or config.is_job:
        raise UserError(
            "--profile times fusiontune's kernels; this study tunes a command target's job, which"
            " has none (profile the job with its own tools)"
        )
    from fusiontune.measure.profile import profile_program
    from fusiontune.tune.evaluate import build_candidate

    workload = _study_workload(info)
    program = build_candidate(workload, config).program
    profile = profile_program(program, workload.inputs)
    stored = StoredProfile(
        config.key(),
        trial,
        workload.name,
        dict(workload.params),
        os.uname().nodename,
        datetime.now(UTC).isoformat(timespec="seconds"),
        profile,
    )
    path = out / PROFILE_FILE
    path.write_text(json.dumps(stored.to_json(), indent=2) + "\n", encoding="utf-8")
    return path


def _study_workload(info: Any) -> Any:
    """The workload a study was made from: its search space's text, else its name and sizes."""
    from fusiontune.workloads.onnx_model import load_workload, space_workload

    if info.space_toml:
        from fusiontune.workloads.space import loads_space

        return space_workload(loads_space(info.space_toml, info.space_path or "<space>"))
    if not info.workload:
        raise UserError("the study records no workload: nothing to profile")
    return load_workload(info.workload, dict(info.sizes))


def profile_blocks(stored: StoredProfile | None, config_key: str | None) -> list[Block]:
    """The section, when a profile of the recommended configuration is stored (else nothing)."""
    if stored is None or config_key is None:
        return []
    doc: list[Block] = [("h2", "Where the time goes (recommended configuration)")]
    if stored.config_key != config_key:
        doc.append(
            (
                "p",
                f"`{PROFILE_FILE}` holds the profile of configuration `{stored.config_key}`"
                f" (measured {stored.time}), not of the recommendation `{config_key}`:"
                " `fusiontune report RESULTS_DIR --profile` measures the recommendation.",
            )
        )
        return doc
    from fusiontune.measure import format_seconds
    from fusiontune.measure.profile import format_count

    p = stored.profile
    doc.append(
        (
            "p",
            f"Every kernel timed on its own in program order over the program's buffers,"
            f" {p.rounds} rounds, on {stored.host} at {stored.time} (`{PROFILE_FILE}`). Roofline:"
            f" {p.bandwidth / 1e9:.1f} GB/s copy bandwidth and {p.peak_flops / 1e9:.1f} GFLOP/s"
            f" float32 sgemm peak on {p.threads} threads, both measured; `% bw` and `% peak` are"
            " the least time the kernel's bytes and FLOPs take there, as a share of its median"
            " (above 100: its data stays in cache).",
        )
    )
    rows = []
    for k in p.kernels[:TOP_KERNELS]:
        rows.append(
            [
                f"`{k.name}`",
                k.kind,
                format_seconds(k.median_s),
                f"{100 * p.share(k):.1f}%",
                format_count(k.bytes_moved, "B"),
                format_count(k.flops, ""),
                _pct(k.pct_bandwidth),
                _pct(k.pct_peak),
                k.bound,
            ]
        )
    rest = p.kernels[TOP_KERNELS:]
    if rest:
        rest_s = math.fsum(k.median_s for k in rest)
        share = 100 * rest_s / p.kernel_sum_s if p.kernel_sum_s > 0 else math.nan
        rows.append([f"{len(rest)} more", "", format_seconds(rest_s), f"{share:.1f}%"] + [""] * 5)
    headers = ["kernel", "kind", "median", "share", "bytes", "FLOPs", "% bw", "% peak", "bound"]
    doc.append(("table", headers, rows))
    doc.append(
        (
            "p",
            f"Sum of the kernels' medians {format_seconds(p.kernel_sum_s)}; whole program"
            f" {format_seconds(p.program_median_s)} (timed in the same rounds); overhead"
            f" {format_seconds(p.overhead_s)}, {p.overhead_per_kernel_s * 1e6:.2f} us per kernel"
            f" call over {len(p.kernels)} kernels.",
        )
    )
    total = p.kernel_sum_s
    kinds = [
        [kind, str(n), format_seconds(s), f"{100 * s / total if total > 0 else math.nan:.1f}%"]
        for kind, (n, s) in p.by_kind().items()
    ]
    doc.append(("table", ["kind", "kernels", "time", "share"], kinds))
    return doc


def _pct(p: float) -> str:
    return "-" if math.isnan(p) else f"{p:.1f}"
