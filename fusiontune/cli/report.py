"""``fusiontune report RESULTS_DIR``: rebuild a study's tables, plots and recommendation."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    """Add ``report`` to the subcommands."""
    p = sub.add_parser(
        "report",
        help="rebuild a study's tables, plots and recommended fusion_switch.cfg from its database",
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="results/<study>")
    p.add_argument(
        "--storage", metavar="URL", help="SQLAlchemy URL (default: sqlite:///RESULTS_DIR/study.db)"
    )
    p.add_argument(
        "--study", metavar="NAME", help="study name (default: the only study in the storage)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="first time the recommended configuration's kernels one by one (profile.json), for"
        " the report's 'Where the time goes' section (a built-in workload or ONNX model)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # Lazy: pandas and optuna are paid for only by the commands that use them.
    from fusiontune.report.build import ReportOptions, report_command

    options = ReportOptions(
        Path(args.results_dir), storage=args.storage, study=args.study, profile=args.profile
    )
    return int(report_command(options))
