"""``fusiontune passes``: the registry as a table (or JSON): aliases, defaults, split points."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fusiontune.cli._options import format_table
from fusiontune.passes.base import KINDS, PassInfo
from fusiontune.passes.registry import PASSES


def add_parser(sub: Any) -> None:
    """Add ``passes`` to the subcommands."""
    p = sub.add_parser("passes", help="list the fusion passes: aliases, defaults, split points")
    p.add_argument("--kind", choices=KINDS, help="only GraphFusion or only UBFusion passes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def list_passes(kind: str | None = None, as_json: bool = False) -> str:
    """The registry's rows (of one ``kind``, or all), as a table or as JSON."""
    infos = [p for p in PASSES if kind is None or p.kind == kind]
    if as_json:
        return json.dumps([_pass_record(p) for p in infos], indent=2)
    headers = (
        "name",
        "alias",
        "kind",
        "default",
        "switchable",
        "exact",
        "split points",
        "description",
    )
    rows = [
        (
            p.name,
            ",".join(p.aliases) or "-",
            p.kind,
            "on" if p.default else "off",
            "yes" if p.switchable else "no",
            "yes" if p.exact else "no",
            _split_points_text(p),
            p.summary,
        )
        for p in infos
    ]
    return format_table(headers, rows)


def _run(args: argparse.Namespace) -> int:
    print(list_passes(args.kind, args.json))
    return 0


def _split_points_text(info: PassInfo) -> str:
    return ", ".join(f"{sp.name}[{sp.low}..{sp.high}]" for sp in info.split_points) or "-"


def _pass_record(info: PassInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "aliases": list(info.aliases),
        "kind": info.kind,
        "stage": info.stage,
        "default": "on" if info.default else "off",
        "switchable": info.switchable,
        "exact": info.exact,
        "expected_error": info.expected_error,
        "split_points": [
            {
                "name": sp.name,
                "low": sp.low,
                "high": sp.high,
                "choices": list(sp.choices),
                "doc": sp.doc,
            }
            for sp in info.split_points
        ],
        "description": info.summary,
    }
