"""``fusiontune bisect SPACE``: the pass, then the single fusion, that breaks the accuracy bound."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusiontune.cli._options import (
    existing_file,
    int_at_least,
    path_or_none,
    positive_finite,
    study_name,
)

if TYPE_CHECKING:
    from fusiontune.bisect.driver import BisectOptions


def add_parser(sub: Any) -> None:
    """Add ``bisect`` to the subcommands."""
    p = sub.add_parser(
        "bisect",
        help="find the pass, then the single fusion, that breaks the accuracy bound",
        description="Delta debugging between a configuration that breaks the space's accuracy bound"
        " (--bad; default: the registry defaults with every inexact pass on) and one that holds it"
        " (--good; default: every switchable pass off): first over the passes in which they differ,"
        " then over the applications of each culprit pass. Writes results/<name>/bisect.json,"
        " bisect.md and safe_fusion_switch.cfg (bad with only the culprits off). Warns when the"
        " bound is below the workload's float32 floor (then even exact passes are blamed). Exit"
        " code 0 when the safe configuration holds the bound, 1 when it does not, 2 on bad input.",
    )
    p.add_argument(
        "space", metavar="SPACE", help="a search space file: the workload, metric and bound"
    )
    p.add_argument(
        "--bad", metavar="FILE", help="fusion_switch.cfg or best_config.json that loses accuracy"
    )
    p.add_argument(
        "--good", metavar="FILE", help="fusion_switch.cfg or best_config.json that holds the bound"
    )
    p.add_argument(
        "--bound",
        metavar="X",
        type=positive_finite("--bound"),
        help="the accuracy bound, a finite number > 0 (default: the space's)",
    )
    p.add_argument(
        "--metric", metavar="M", help="max_abs, max_rel, rel_l2 or cosine (default: the space's)"
    )
    p.add_argument(
        "--name",
        metavar="NAME",
        type=study_name("--name"),
        help="results/<NAME>/ (default: the space's name)",
    )
    p.add_argument(
        "--workers",
        metavar="K",
        type=int_at_least("--workers", 0),
        default=0,
        help="Ray workers; 0 (default) evaluates in this process: the search asks one question at a time",
    )
    p.add_argument(
        "--ray-address", metavar="ADDR", help="join a running Ray cluster (with --workers K)"
    )
    p.add_argument(
        "--replay",
        metavar="FILE",
        type=existing_file("--replay", allow_url=True),
        help="answer from a recorded study.db or bisect.json instead of measuring",
    )
    p.set_defaults(func=_run)


def bisect_options(args: argparse.Namespace) -> BisectOptions:
    """The typed options of the parsed ``bisect`` arguments."""
    from fusiontune.bisect.driver import BisectOptions

    return BisectOptions(
        space=Path(args.space),
        bad=path_or_none(args.bad),
        good=path_or_none(args.good),
        bound=args.bound,
        metric=args.metric,
        name=args.name,
        workers=args.workers,
        ray_address=args.ray_address,
        replay=args.replay,
    )


def _run(args: argparse.Namespace) -> int:
    from fusiontune.bisect.driver import bisect_command

    return int(bisect_command(bisect_options(args)))
