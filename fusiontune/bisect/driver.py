"""``fusiontune bisect``'s driver: a space and typed options in, culprits printed, outputs written.

The search itself (:func:`fusiontune.bisect.bisect`) takes an evaluator and two configurations;
this module makes them from a search space (:func:`fusiontune.tune.factory.create_evaluator`),
warns when the bound is below the workload's float32 floor, and prints what it found.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusiontune.bisect import (
    BisectError,
    BisectResult,
    bisect,
    changes_between,
    default_bad,
    format_error,
    write_outputs,
)
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError


@dataclass(frozen=True)
class BisectOptions:
    """What one bisection is asked to do; None means the space's own setting or the default.

    Attributes:
        space: the search space file: the workload (or command target), metric and bound.
        bad: a ``fusion_switch.cfg`` or ``best_config.json`` that loses accuracy (default:
            :func:`default_bad`, or a job's defaults).
        good: one that holds the bound (default: every switchable pass off).
        bound: the accuracy bound (finite, > 0).
        metric: max_abs, max_rel, rel_l2 or cosine.
        name: the output folder ``results/<name>/`` (default: the space's name).
        workers: 0 evaluates in this process; K >= 1 uses K Ray workers.
        ray_address: join this running Ray cluster (with workers).
        replay: answer from a recorded ``study.db`` or ``bisect.json`` instead of measuring.
    """

    space: Path
    bad: Path | None = None
    good: Path | None = None
    bound: float | None = None
    metric: str | None = None
    name: str | None = None
    workers: int = 0
    ray_address: str | None = None
    replay: str | None = None

    def __post_init__(self) -> None:
        from fusiontune.workloads.space import STUDY_NAME_RULE, is_study_name

        if self.workers < 0:
            raise UserError(f"workers must be >= 0, got {self.workers}")
        if self.bound is not None and not (self.bound > 0 and math.isfinite(self.bound)):
            raise UserError(f"the bound must be a finite number > 0, got {self.bound}")
        if self.name is not None and not is_study_name(self.name):
            raise UserError(f"name {self.name!r}: not a study name ({STUDY_NAME_RULE})")


def bisect_command(options: BisectOptions) -> int:
    """Find the culprits of a space's accuracy loss, print each evaluation, write the outputs.

    Before searching, warns (one ``fusiontune: warning:`` line on stderr) when the bound is
    below the float32 floor of the space's workload (:func:`float32_floor_error`): then even
    exact passes break it by rounding differently, and will be blamed.

    Args:
        options: see :class:`BisectOptions`.

    Returns:
        The exit code: 0 when the safe configuration holds the bound, 1 when it does not, 130
        when interrupted (the evaluations so far are written).

    Raises:
        UserError: a bad space, metric, bound or configuration file; BisectError when the
            endpoints do not bracket the bound (the evaluations made are written first).
    """
    from fusiontune.config.switch_file import load_config
    from fusiontune.measure import METRICS
    from fusiontune.tune.factory import create_evaluator
    from fusiontune.workloads.space import load_space

    space = load_space(options.space)
    metric = options.metric or space.metric
    if space.target is not None and metric != space.metric:
        raise UserError(
            f"--metric {metric}: a command target bounds the error its job reports (metric {space.metric})"
        )
    if space.target is None and metric not in METRICS:
        raise UserError(f"--metric {metric}: unknown (known: {', '.join(METRICS)})")
    bound = space.bound if options.bound is None else options.bound
    if not (bound >= 0 and math.isfinite(bound)):
        raise UserError(f"the bound must be a finite number >= 0, got {bound}")
    out_dir = Path("results") / (options.name or space.name)
    if space.target is not None:
        # The job's defaults (every listed pass on) against every switchable listed pass off.
        passes = space.passes
        bad = (
            load_config(options.bad, passes=passes)
            if options.bad
            else FusionConfig.defaults(passes)
        )
        good = (
            load_config(options.good, passes=passes)
            if options.good
            else FusionConfig.all_off(passes)
        )
        what, bad_label = (
            f"the job `{space.target.describe()}`",
            "the job's defaults (every listed pass on)",
        )
        workload = f"command: {space.target.describe()}"
    else:
        bad = load_config(options.bad) if options.bad else default_bad()
        good = load_config(options.good) if options.good else FusionConfig.all_off()
        what, bad_label, workload = space.workload, "defaults + every inexact pass", space.workload
    created = create_evaluator(
        space,
        workers=options.workers,
        ray_address=options.ray_address,
        replay=options.replay,
        base_dir=out_dir / "bisect",
    )
    evaluator = created.evaluator
    print(
        f"bisect {what}: {metric} <= {bound:g}; bad = {options.bad or bad_label},"
        f" good = {options.good or 'every switchable pass off'}; {len(changes_between(good, bad))} passes differ"
    )
    if space.target is None and not options.replay:  # a replay measures nothing
        floor = float32_floor_error(space, metric, created.workload)
        if floor > bound:
            warn(
                f"the bound {metric} <= {bound:g} is below the float32 floor of {space.workload}"
                f" ({metric} {floor:.3g}, the unfused program in float32 vs the float64 reference):"
                " even exact passes will be blamed for rounding"
            )
    result = BisectResult(metric, bound, bad, good, math.nan, math.nan)
    try:
        bisect(evaluator, bad, good, bound, metric, result=result)
    except KeyboardInterrupt:
        result.status = "interrupted"
        paths = write_outputs(result, out_dir, workload)
        print(f"interrupted: the {len(result.evaluations)} evaluations so far are in {paths[0]}")
        return 130
    except BisectError:
        result.status = "refused"
        write_outputs(result, out_dir, workload)
        raise
    finally:
        evaluator.close()
    paths = write_outputs(result, out_dir, workload)
    print()
    for c in result.culprits:
        where = "; ".join(f"#{i}: {', '.join(nodes)}" for i, nodes in c.applications) or c.note
        print(
            f"culprit: {c.name}  ({len(c.applications)} of {c.total_applications} applications)  {where}"
        )
    verdict = "holds" if result.holds else "does NOT hold"
    print(
        f"{metric}: bad {format_error(result.bad_error)}, good {format_error(result.good_error)}, safe {format_error(result.safe_error)}"
        f" ({verdict} the bound {bound:g})"
    )
    print(
        f"{len(result.evaluations)} evaluations (a linear scan would have taken {result.linear_scan_evaluations})"
    )
    print("wrote:")
    for p in paths:
        print(f"  {p}")
    return 0 if result.holds else 1


def float32_floor_error(space: Any, metric: str, workload: Any = None) -> float:
    """The ``metric`` error of the space's unfused workload in float32 against its float64 reference.

    The floor ``fusiontune run`` prints (:func:`fusiontune.runner.float32_floor`): one interpreter
    run in float32. ``workload`` is reused when the evaluator already built it; otherwise it is
    built here (its float64 reference is one more interpreter run).
    """
    from fusiontune.measure import metric_value
    from fusiontune.runner import float32_floor
    from fusiontune.workloads.onnx_model import space_workload

    return float(metric_value(float32_floor(workload or space_workload(space)), metric))


def warn(message: str) -> None:
    """One ``fusiontune: warning:`` line on stderr; the work goes on."""
    print(f"fusiontune: warning: {message}", file=sys.stderr)
