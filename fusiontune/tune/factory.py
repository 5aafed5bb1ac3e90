"""The one place an evaluator is chosen: :func:`create_evaluator` (like TVM's ``Runner.create``).

The tuning driver and the bisection ask it for the evaluator of a search space:

======================================  ==================================================
what                                    evaluator
======================================  ==================================================
``replay`` set (``study.db``, a URL,    :class:`~fusiontune.tune.replay.ReplayEvaluator`
or a ``bisect.json``)
a command target, ``workers == 0``      :class:`~fusiontune.tune.command.CommandEvaluator`
a command target, ``workers >= 1``      :class:`~fusiontune.tune.ray_command.RayCommandEvaluator`
a workload, ``workers == 0``            :class:`~fusiontune.tune.evaluator.LocalEvaluator`
a workload, ``workers >= 1``            :class:`~fusiontune.tune.ray_evaluator.RayEvaluator`
======================================  ==================================================

Every evaluator module is imported lazily: Ray, numba and the command runner are paid for only
by the runs that use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fusiontune.errors import UserError

if TYPE_CHECKING:
    from fusiontune.tune.evaluator import Evaluator
    from fusiontune.workloads import Workload
    from fusiontune.workloads.space import SearchSpace


@dataclass(frozen=True)
class CreatedEvaluator:
    """What :func:`create_evaluator` made.

    Attributes:
        evaluator: the evaluator (close it when done).
        workload: the workload, when it was built in this process (the in-process evaluator);
            None otherwise (Ray actors build their own, a replay and a command target have none).
    """

    evaluator: Evaluator
    workload: Workload | None = None


def create_evaluator(
    space: SearchSpace,
    *,
    workers: int = 0,
    ray_address: str | None = None,
    replay: str | None = None,
    base_dir: str | Path | None = None,
) -> CreatedEvaluator:
    """The evaluator of ``space``, chosen by the table in this module's docstring.

    Args:
        space: the search space: its workload (or command target), sizes and measurement.
        workers: 0 evaluates in this process; K >= 1 uses K Ray workers.
        ray_address: join this running Ray cluster instead of starting one (with workers).
        replay: answer from a recorded study (a ``study.db`` path or a storage URL) or a
            ``bisect.json`` instead of measuring.
        base_dir: where a command target's requests run, one folder each (default
            ``results/<space name>/trials``).

    Returns:
        The evaluator, and the workload when it was built here.

    Raises:
        UserError: ``workers`` is negative, the replay file does not exist, or workers are asked
            for and Ray is not installed.
    """
    if workers < 0:
        raise UserError(f"workers must be 0 (in process) or more, got {workers}")
    if replay:
        return CreatedEvaluator(_replay_evaluator(replay))
    if space.target is not None:
        from fusiontune.tune.command import CommandEvaluator

        base = Path(base_dir) if base_dir is not None else Path("results") / space.name / "trials"
        if workers == 0:
            return CreatedEvaluator(CommandEvaluator(space.target, base))
        _require_ray(workers)
        from fusiontune.tune.ray_command import RayCommandEvaluator

        return CreatedEvaluator(
            RayCommandEvaluator(space.target, base, workers, address=ray_address)
        )
    from fusiontune.workloads.onnx_model import space_workload, workload_source

    if workers == 0:
        from fusiontune.tune.evaluator import LocalEvaluator

        workload = space_workload(space)
        return CreatedEvaluator(LocalEvaluator(workload, space.measure), workload)
    _require_ray(workers)
    from fusiontune.tune.ray_evaluator import RayEvaluator

    evaluator = RayEvaluator(
        workload_source(space),  # a built-in name or an OnnxSource: each actor builds it
        dict(space.sizes),
        space.measure,
        workers,
        address=ray_address,
        trial_timeout_s=space.trial_timeout_s,
        train=space.train,
    )
    return CreatedEvaluator(evaluator)


def _replay_evaluator(path: str) -> Evaluator:
    from fusiontune.tune.replay import ReplayEvaluator

    if "://" not in path and not Path(path).is_file():
        raise UserError(f"{path}: no such file (replay needs a recorded study.db or bisect.json)")
    if path.endswith(".json"):
        return ReplayEvaluator.from_bisect(path)
    return ReplayEvaluator.from_study(path)


def _require_ray(workers: int) -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError(
            f"{workers} workers need Ray: pip install 'ray>=2.30', or evaluate in process (0 workers)"
        ) from None
