"""CANN's ``fusion_result.json``: per graph and pass, how often it matched and how often it applied.

CANN writes a list with one entry per (session, graph)::

    [{"graphId": "0", "session_and_graph_id": "0_0",
      "graph_fusion": {"SoftmaxFusionPass": {"match_times": "2", "effect_times": "2"}},
      "ub_fusion": {"TbeEltwiseFusionPass": {"match_times": "3", "effect_times": "3"}}}]

Counts are strings in CANN's files; integers are accepted too. Pass names are not checked against
the registry: a file from a real CANN run names many passes fusiontune does not model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from fusiontune.config.fusion_config import ConfigError
from fusiontune.config.switch_file import check_json_depth, read_text
from fusiontune.passes.base import FusionReport

SECTIONS = ("graph_fusion", "ub_fusion")
_GRAPH_KEYS = ("graphId", "session_and_graph_id")


class FusionCounts(NamedTuple):
    """One pass's totals over every graph and pattern in the file."""

    match_times: int
    effect_times: int


def write_fusion_result(
    report: FusionReport, path: str | os.PathLike[str], graph_id: int = 0
) -> Path:
    """Write ``report`` as CANN's ``fusion_result.json`` (a one-element list, pretty-printed).

    Args:
        report: what the pipeline did.
        path: the file to write; its folder is created.
        graph_id: the graph id CANN would give the model.

    Returns:
        The path written.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps([report.to_fusion_result(graph_id)], indent=4) + "\n", encoding="utf-8")
    return p


def read_fusion_result(path: str | os.PathLike[str]) -> dict[str, FusionCounts]:
    """Read a ``fusion_result.json``: CANN's list of graphs, one graph entry, or ``{pass: counts}``.

    Args:
        path: the file.

    Returns:
        Pass name -> (match_times, effect_times), summed over graphs and sections, in file order.

    Raises:
        ConfigError: one line naming the file and the key: a missing file, one over the size
            limit, malformed or too deeply nested JSON, a wrong type, or a count that is not a
            non-negative integer.
    """
    source = str(path)
    text = read_text(path)
    check_json_depth(text, source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None
    entries = data if isinstance(data, list) else [data]
    totals: dict[str, FusionCounts] = {}
    for i, entry in enumerate(entries):
        key = f"[{i}]" if isinstance(data, list) else "top level"
        for name, counts in _entry_counts(entry, key, source):
            before = totals.get(name, FusionCounts(0, 0))
            totals[name] = FusionCounts(
                before.match_times + counts.match_times, before.effect_times + counts.effect_times
            )
    return totals


def _entry_counts(entry: Any, key: str, source: str) -> list[tuple[str, FusionCounts]]:
    if not isinstance(entry, dict):
        raise ConfigError(f"{source}: {key}: expected an object, got {type(entry).__name__}")
    prefix = "" if key == "top level" else f"{key}."
    if any(s in entry for s in SECTIONS):
        found = []
        for section in SECTIONS:
            body = entry.get(section, {})
            if not isinstance(body, dict):
                raise ConfigError(f"{source}: {prefix}{section}: expected an object")
            found += [
                (name, _counts(value, f"{prefix}{section}.{name}", source))
                for name, value in body.items()
            ]
        return found
    # No sections: a flat {pass: {"match_times": ..., "effect_times": ...}} mapping.
    return [
        (name, _counts(value, f"{prefix}{name}", source))
        for name, value in entry.items()
        if name not in _GRAPH_KEYS
    ]


def _counts(value: Any, key: str, source: str) -> FusionCounts:
    if not isinstance(value, dict):
        raise ConfigError(
            f"{source}: {key}: expected an object with match_times and effect_times "
            f"(or graph_fusion / ub_fusion sections), got {json.dumps(value)}"
        )
    return FusionCounts(
        _count(value, "match_times", key, source), _count(value, "effect_times", key, source)
    )


def _count(value: dict[str, Any], field: str, key: str, source: str) -> int:
    if field not in value:
        raise ConfigError(f"{source}: {key}.{field}: missing key")
    raw = value[field]
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    if isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
        return int(raw)
    raise ConfigError(
        f"{source}: {key}.{field}: expected a non-negative count, got {json.dumps(raw)}"
    )
