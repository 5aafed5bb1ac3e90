"""Read what a user's job reported: its metrics on stdout, its fusion statistics.

Metrics: the last line of stdout that parses as a JSON object (scanning from the end), and a key
of it (``a.b`` reaches into nested objects); or a regular expression, whose last match's first
group (the whole match when it has none) is the value. Fusion statistics: CANN's
``fusion_result.json`` when the job leaves one, else GE's log lines
``GraphFusionPass[Name]: pattern=P, matched_times=N, effected_times=M`` (UBFusionPass too) found
in its stdout and stderr, summed per pass over patterns and graphs.

A metric is refused unless it can be one: a runtime must be a finite number > 0, an error a
finite number >= 0 (a negative runtime would win the sweep, an ``Infinity`` error would pass no
bound and a negative one every bound). A JSON value must be a JSON number (``"0.1"``, a string,
is refused: the job meant something else, or nothing); a regular expression's match is text by
nature and is parsed. The same rule (:func:`result_metric_problem`) is checked again where a
job's result arrives from elsewhere: a Ray node, the confirmation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fusiontune.tune.records import EvalResult, EvalStatus
from fusiontune.workloads.target import MetricSpec

_FUSION_LINE = re.compile(
    r"\b(\w*)Pass\[([^\]\s]+)\]:\s*pattern=([^,\s]*),\s*matched_times=(\d+),\s*effected_times=(\d+)"
)


class MetricError(ValueError):
    """A metric that could not be read; the message says which and why."""


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that parses as a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _lookup(data: Mapping[str, Any], key: str) -> Any:
    if key in data:
        return data[key]
    value: Any = data
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


_RULES = {
    "runtime": "a runtime must be finite and > 0",
    "error": "an error must be finite and >= 0",
}


def _spelled(value: float) -> str:
    """A number as the job would have printed it: ``-0.5``, ``Infinity``, ``NaN``."""
    return json.dumps(value)


def metric_problem(name: str, value: float, what: str | None = None) -> str:
    """Why ``value`` cannot be the metric ``name`` (``runtime`` or ``error``), or "" when it can.

    Args:
        name: ``runtime`` (finite, > 0) or ``error`` (finite, >= 0); other names: finite.
        value: the number read.
        what: how the message names it (the job's key); ``name`` when None.
    """
    what = what or name
    if name == "runtime":
        bad = not (math.isfinite(value) and value > 0)
    elif name == "error":
        bad = not (math.isfinite(value) and value >= 0)
    else:
        bad = not math.isfinite(value)
    if not bad:
        return ""
    return f"{what} is {_spelled(value)}: {_RULES.get(name, 'a metric must be finite')}"


def _number(value: Any, name: str, what: str, *, text: bool) -> float:
    """``value`` as the metric ``name``; ``text``: it came from a regex match (a string is parsed)."""
    if isinstance(value, str) and not text:
        raise MetricError(
            f"{what} is {json.dumps(value)[:80]}, a JSON string: it must be a JSON number"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MetricError(f"{what} is {json.dumps(value)[:80]}, not a number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise MetricError(f"{what} is {value!r}, not a number") from None
    problem = metric_problem(name, number, what)
    if problem:
        raise MetricError(problem)
    return number


def read_metric(spec: MetricSpec, stdout: str, data: Mapping[str, Any] | None) -> float:
    """One metric from the job's stdout.

    Args:
        spec: where it is.
        stdout: the job's stdout.
        data: its last JSON object (:func:`last_json_object`), None when it printed none.

    Raises:
        MetricError: no JSON object, a missing key, no match, a value that is not a number (a
            JSON string included), or one the metric cannot have (:func:`metric_problem`).
    """
    if spec.regex is not None:
        matches = list(re.finditer(spec.regex, stdout, re.MULTILINE))
        if not matches:
            raise MetricError(f"{spec.name}_regex {spec.regex!r} matches nothing on stdout")
        m = matches[-1]
        text = m.group(1) if m.re.groups else m.group(0)
        return _number(text, spec.name, f"{spec.name} (from {spec.name}_regex)", text=True)
    assert spec.key is not None
    if data is None:
        raise MetricError(
            f'no JSON object on stdout (expected a last line like {{"{spec.key}": ...}})'
        )
    try:
        value = _lookup(data, spec.key)
    except KeyError:
        keys = ", ".join(list(data)[:10]) or "none"
        raise MetricError(
            f"metric key {spec.key!r} ({spec.name}) is not in the JSON object on stdout (its keys: {keys})"
        ) from None
    return _number(value, spec.name, spec.key, text=False)


def result_metric_problem(result: EvalResult) -> str:
    """Why an ``ok`` result of a command target cannot stand (:func:`metric_problem`), or "".

    For results that arrive from elsewhere (a Ray node that may run another version, an
    evaluator given to the confirmation): each runtime sample and the reported ``error``.
    """
    if not result.ok:
        return ""
    runtimes = result.samples_s or ((result.median_s,) if not math.isnan(result.median_s) else ())
    for runtime in runtimes:
        problem = metric_problem("runtime", runtime, "the runtime")
        if problem:
            return problem
    if "error" not in result.reported:
        return "the result has no reported error"
    return metric_problem("error", float(result.reported["error"]), "the error")


def refuse_bad_metrics(result: EvalResult) -> EvalResult:
    """``result``, or a ``run failed`` copy of it when :func:`result_metric_problem` finds one."""
    problem = result_metric_problem(result)
    if not problem:
        return result
    return dataclasses.replace(
        result,
        status=EvalStatus.RUN_FAILED,
        error_msg=problem,
        median_s=math.inf,
        iqr_s=math.inf,
        cv=math.inf,
        min_s=math.inf,
        samples_s=(),
    )


def extra_metrics(data: Mapping[str, Any] | None) -> dict[str, float]:
    """Every top-level number of the JSON object, kept with the trial."""
    out: dict[str, float] = {}
    for key, value in (data or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


def fusion_from_log(*texts: str) -> dict[str, tuple[int, int]]:
    """Per pass, (matched_times, effected_times) summed over the GE log lines in ``texts``."""
    out: dict[str, tuple[int, int]] = {}
    for text in texts:
        for m in _FUSION_LINE.finditer(text):
            name = m.group(2)
            matched, effected = out.get(name, (0, 0))
            out[name] = (matched + int(m.group(4)), effected + int(m.group(5)))
    return out


def fusion_from_result_file(path: Path) -> dict[str, tuple[int, int]]:
    """Per pass, (match_times, effect_times) from a CANN ``fusion_result.json``.

    Raises:
        ValueError: the file is not one (:class:`ConfigError`, with the file and the key).
    """
    from fusiontune.config.fusion_result import read_fusion_result

    return {name: (c.match_times, c.effect_times) for name, c in read_fusion_result(path).items()}


def read_text(path: Path) -> str:
    """A log file as text (bytes that are not UTF-8 replaced); "" when it is missing."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_line(text: str, limit: int = 300) -> str:
    """The last non-empty line of ``text``, shortened: what a failed job said last."""
    for line in reversed(text.splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""
