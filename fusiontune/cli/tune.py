"""``fusiontune tune SPACE``: search fusion configurations, confirm the best, report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusiontune.cli._options import duration, existing_file, int_at_least, study_name

if TYPE_CHECKING:
    from fusiontune.tune.driver import TuneOptions


def add_parser(sub: Any) -> None:
    """Add ``tune`` to the subcommands."""
    p = sub.add_parser(
        "tune",
        help="search fusion configurations (optuna over passes and split points), then report",
        description="Search a space (search_spaces/*.toml) for the fastest configuration within its"
        " accuracy bound. Results go to results/<study>/; the same command run again continues the"
        " study up to --trials. Ctrl-C stops after the trials in flight are recorded.",
    )
    p.add_argument(
        "space", metavar="SPACE", help="a search space file, e.g. search_spaces/mlp.toml"
    )
    p.add_argument(
        "--trials",
        metavar="N",
        type=int_at_least("--trials", 1),
        help="total finished trials to reach, >= 1 (default: the space's)",
    )
    p.add_argument(
        "--runs",
        metavar="N",
        type=int_at_least("--runs", 1),
        help="a command target's budget of job runs for this call; with racing, the runs a"
        " raced-out trial saves pay for new trials (whichever of --trials and --runs comes first)",
    )
    p.add_argument(
        "--timeout",
        metavar="DURATION",
        type=duration("--timeout"),
        help='wall-time budget, e.g. "30m", "8h" (default: the space\'s)',
    )
    p.add_argument(
        "--workers",
        metavar="K",
        type=int_at_least("--workers", 0),
        help="Ray workers; 0 evaluates in this process (default: the space's)",
    )
    p.add_argument(
        "--ray-address", metavar="ADDR", help="join a running Ray cluster instead of starting one"
    )
    p.add_argument(
        "--storage",
        metavar="URL",
        help="SQLAlchemy URL of the study (default: sqlite:///results/<study>/study.db)",
    )
    p.add_argument(
        "--study",
        metavar="NAME",
        type=study_name("--study"),
        help="study name, and the folder results/<NAME>/ (default: the space's name)",
    )
    p.add_argument(
        "--sampler",
        metavar="NAME",
        help="tpe, fusion, random, grid or nsga2 (default: the space's)",
    )
    p.add_argument(
        "--seed",
        metavar="S",
        type=int_at_least("--seed", 0),
        help="sampler seed, >= 0 (default: the space's)",
    )
    p.add_argument(
        "--top-k",
        metavar="K",
        type=int_at_least("--top-k", 0),
        help="configurations measured again at the end, >= 0 (default: the space's)",
    )
    p.add_argument("--no-confirm", action="store_true", help="skip the confirmation measurements")
    p.add_argument(
        "--replay",
        metavar="STUDY_DB",
        type=existing_file("--replay", allow_url=True),
        help="answer from a recorded study (study.db or a storage URL) instead of measuring",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def tune_options(args: argparse.Namespace) -> TuneOptions:
    """The typed options of the parsed ``tune`` arguments."""
    from fusiontune.tune.driver import TuneOptions

    return TuneOptions(
        space=Path(args.space),
        trials=args.trials,
        timeout_s=args.timeout,
        runs=args.runs,
        workers=args.workers,
        ray_address=args.ray_address,
        storage=args.storage,
        study=args.study,
        sampler=args.sampler,
        seed=args.seed,
        top_k=args.top_k,
        confirm=not args.no_confirm,
        replay=args.replay,
        progress=not args.no_progress,
    )


def _run(args: argparse.Namespace) -> int:
    # Lazy: optuna, numba and (with workers) Ray are paid for only by the commands that use them.
    from fusiontune.tune.driver import tune_command

    return int(tune_command(tune_options(args)))
