"""CommandTarget: a user's own job as the thing a search space tunes (``[target] kind = "command"``).

fusiontune's numba backend is the embedded target. A user who deploys on Ascend tunes the real
job instead: an ATC conversion plus an inference run, or a MindSpore training script. The space
then says how to run it, which of the job's passes to switch, and how to read its metrics::

    [target]
    kind = "command"
    command = ["python", "job.py", "--fusion-switch-file", "{switch_file}"]   # argv; no shell
    env = { MS_DEV_GRAPH_KERNEL_FLAGS = "{graph_kernel_flags}" }
    workdir = "."                  # relative to the space file's folder
    timeout_s = 600
    repeats = 1
    racing = true                  # with repeats >= 3: stop repeating a clearly slower configuration
    [target.metrics]               # read from the last JSON object printed on stdout
    runtime = "runtime_s"
    error = "error"
    [passes]
    GraphFusion = ["SoftmaxFusionPass", "MatMulBiasAddFusionPass"]
    UBFusion = ["TbeEltwiseFusionPass"]
    not_switchable = []

This module holds the record and the part of the loader that checks it;
:mod:`fusiontune.tune.command` runs it. ``search_spaces/README.md`` documents every key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fusiontune.config.fusion_config import JobPass, job_table
from fusiontune.passes.base import KINDS

PLACEHOLDERS = {
    "switch_file": "the trial's fusion_switch.cfg (CANN JSON form), an absolute path",
    "graph_kernel_flags": "the MindSpore graph_kernel_flags string (--enable_pass=... --disable_pass=...)",
    "config_json": "the trial's configuration as best_config.json, an absolute path",
    "trial_dir": "the trial's own folder, an absolute path (results/<study>/trials/<number>)",
    "python": "the Python interpreter running fusiontune",
}
"""What a ``{name}`` in ``command``, ``env`` and ``workdir`` becomes for each trial."""

TARGET_KEYS = ("kind", "command", "env", "workdir", "timeout_s", "repeats", "racing", "shell", "metrics")
METRIC_KEYS = ("runtime", "error", "runtime_regex", "error_regex")
PASS_KEYS = (*KINDS, "not_switchable", "fixed")
DEFAULT_TIMEOUT_S = 600.0
MAX_REPEATS = 100

_TEMPLATE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_PASS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class MetricSpec:
    """Where one metric is read from the job's stdout: a key of its last JSON object, or a regex.

    Attributes:
        name: ``runtime`` or ``error``.
        key: the key in the last JSON object printed on stdout (``a.b`` reaches into an object).
        regex: else a regular expression searched in stdout; its last match's first group (or
            the whole match) is the value.
    """

    name: str
    key: str | None = None
    regex: str | None = None

    def describe(self) -> str:
        return f"{self.name}_regex {self.regex!r}" if self.regex is not None else f"key {self.key!r}"


@dataclass(frozen=True)
class CommandTarget:
    """How to run the user's job for one configuration, and how to read what it measured.

    Attributes:
        command: the argv, each item a template (``{switch_file}`` ...); with ``shell``, one
            string for ``/bin/sh -c`` (placeholders are substituted shell-quoted).
        env: variables added to the job's environment, values are templates.
        workdir: the job's working directory, a template; relative to ``base_dir``.
        base_dir: the folder of the space file (absolute).
        timeout_s: one run of the job longer than this is killed (its whole process group).
        repeats: runs per configuration; the runtime is their median, the error their maximum.
        shell: run ``command`` through the shell.
        runtime: where the runtime (seconds, minimized) is read.
        error: where the error (bounded by ``accuracy.bound``) is read.
        passes: the job's passes: what ``fusion_switch.cfg`` and the flags name.
        racing: stop repeating a configuration once its runs are clearly slower than the
            incumbent's, or its error breaks the bound (:mod:`fusiontune.measure.racing`); the
            confirmation stops re-running a candidate clearly slower than the best the same way.
            Saves runs only with ``repeats >= 3`` (the first look is after run 2), except in the
            confirmation, which looks after each round.
    """

    command: tuple[str, ...] | str
    env: tuple[tuple[str, str], ...]
    workdir: str
    base_dir: str
    timeout_s: float
    repeats: int
    shell: bool
    runtime: MetricSpec
    error: MetricSpec
    passes: tuple[JobPass, ...]
    racing: bool = True

    def describe(self) -> str:
        """The command line, for messages and the report."""
        if isinstance(self.command, str):
            return self.command
        return " ".join(self.command)

    def to_json(self) -> dict[str, Any]:
        """What the study records about the target (its user attr ``target``)."""
        return {
            "kind": "command",
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "env": dict(self.env),
            "workdir": self.workdir,
            "base_dir": self.base_dir,
            "timeout_s": self.timeout_s,
            "repeats": self.repeats,
            "racing": self.racing,
            "shell": self.shell,
            "metrics": {
                m.name + ("_regex" if m.regex is not None else ""): m.regex or m.key
                for m in (self.runtime, self.error)
            },
            "passes": {
                kind: [p.name for p in self.passes if p.kind == kind] for kind in KINDS
            }
            | {"not_switchable": [p.name for p in self.passes if not p.switchable]},
        }


def render(template: str, values: Mapping[str, str], quote: Callable[[str], str] | None = None) -> str:
    """Substitute ``{name}`` placeholders; ``{{`` and ``}}`` are literal braces.

    Args:
        template: the text.
        values: placeholder -> value.
        quote: applied to each substituted value (``shlex.quote`` for a shell line).

    Raises:
        KeyError: a placeholder that ``values`` lacks (the loader has refused unknown ones).
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        value = values[m.group(1).strip()]
        return quote(value) if quote else value

    return _TEMPLATE.sub(sub, template)


def placeholders_in(template: str) -> list[str]:
    """The placeholder names a template uses, in order."""
    return [m.group(1).strip() for m in _TEMPLATE.finditer(template) if m.group(1) is not None]


# ---- loading -------------------------------------------------------------------------------------
Fail = Callable[[str, str], NoReturn]


def toml_kind(value: object) -> str:
    """The TOML type of a value, for messages ("an integer", "a table", ...)."""
    for types, name in (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (list, "an array"),
        (dict, "a table"),
    ):
        if isinstance(value, types):
            return name
    return "a date/time"


def _check_template(text: str, key: str, fail: Fail) -> str:
    for name in placeholders_in(text):
        if name not in PLACEHOLDERS:
            fail(key, f"unknown placeholder {{{name}}} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)};"
                 " write {{ and }} for literal braces)")
    stray = _TEMPLATE.sub("", text)
    if "{" in stray or "}" in stray:
        fail(key, f"unbalanced brace in {text!r} (write {{{{ and }}}} for literal braces)")
    return text


def load_target(
    table: Mapping[str, Any], passes: tuple[JobPass, ...], space_path: str, fail: Fail
) -> CommandTarget:
    """Check the ``[target]`` table of a space.

    Args:
        table: the parsed table.
        passes: the job's pass table (from :func:`load_job_passes`).
        space_path: the space file; a relative ``workdir`` is relative to its folder.
        fail: raises the loader's one-line error for a key path and a message.

    Returns:
        The target.
    """
    for name in table:
        if name not in TARGET_KEYS:
            fail(f"target.{name}", f"unknown key (known: {', '.join(TARGET_KEYS)})")
    if "kind" not in table:
        fail("target.kind", 'missing: kind = "command" (the only kind of target)')
    if table["kind"] != "command":
        got = repr(table["kind"]) if isinstance(table["kind"], str) else toml_kind(table["kind"])
        fail("target.kind", f'expected "command" (the only kind of target), got {got}')
    shell = table.get("shell", False)
    if not isinstance(shell, bool):
        fail("target.shell", f"expected true or false, got {toml_kind(shell)}")
    command = _command(table, shell, fail)
    env_table = table.get("env", {})
    if not isinstance(env_table, dict):
        fail("target.env", f"expected a table of NAME = \"value\", got {toml_kind(env_table)}")
    env: list[tuple[str, str]] = []
    for name, value in env_table.items():
        key = f"target.env.{name}"
        if not _ENV_NAME.fullmatch(name):
            fail(key, "not a valid environment variable name")
        if not isinstance(value, str):
            fail(key, f"expected a string (quote numbers), got {toml_kind(value)}")
        env.append((name, _check_template(value, key, fail)))
    workdir = table.get("workdir", ".")
    if not isinstance(workdir, str) or not workdir:
        fail("target.workdir", f"expected a folder (a string), got {toml_kind(workdir)}")
    _check_template(workdir, "target.workdir", fail)
    timeout = table.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 or timeout == float("inf"):
        got = repr(timeout) if isinstance(timeout, (int, float, str)) else toml_kind(timeout)
        fail("target.timeout_s", f"expected a positive number of seconds, got {got}")
    repeats = table.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        got = repr(repeats) if isinstance(repeats, (int, float, str)) else toml_kind(repeats)
        fail("target.repeats", f"expected an integer from 1 to {MAX_REPEATS}, got {got}")
    racing = table.get("racing", True)
    if not isinstance(racing, bool):
        fail("target.racing", f"expected true or false, got {toml_kind(racing)}")
    runtime, error = _metrics(table.get("metrics", {}), fail)
    base = Path(space_path).resolve().parent
    return CommandTarget(
        command=command,
        env=tuple(env),
        workdir=workdir,
        base_dir=str(base),
        timeout_s=float(timeout),
        repeats=repeats,
        shell=shell,
        runtime=runtime,
        error=error,
        passes=passes,
        racing=racing,
    )


def _command(table: Mapping[str, Any], shell: bool, fail: Fail) -> tuple[str, ...] | str:
    if "command" not in table:
        fail("target.command", 'missing: the job\'s argv, e.g. ["python", "job.py", "{switch_file}"]')
    command = table["command"]
    if shell:
        if not isinstance(command, str) or not command.strip():
            fail("target.command", f"with shell = true, expected one command line (a string), got {toml_kind(command)}")
        return _check_template(command, "target.command", fail)
    if isinstance(command, str):
        fail("target.command", "expected an argv array of strings, e.g. [\"python\", \"job.py\"] (no shell;"
             " set shell = true to run a command line through /bin/sh)")
    if not isinstance(command, list) or not command:
        fail("target.command", f"expected a non-empty array of strings, got {toml_kind(command)}")
    for i, word in enumerate(command):
        if not isinstance(word, str):
            fail(f"target.command[{i}]", f"expected a string, got {toml_kind(word)}")
        _check_template(word, f"target.command[{i}]", fail)
    if not command[0].strip():
        fail("target.command[0]", "the program is empty")
    return tuple(command)


def _metrics(table: object, fail: Fail) -> tuple[MetricSpec, MetricSpec]:
    if not isinstance(table, dict):
        fail("target.metrics", f"expected a table, got {toml_kind(table)}")
    for name in table:
        if name not in METRIC_KEYS:
            fail(f"target.metrics.{name}", f"unknown key (known: {', '.join(METRIC_KEYS)})")
    specs = []
    for name, default in (("runtime", "runtime_s"), ("error", "error")):
        key, regex = table.get(name), table.get(f"{name}_regex")
        if key is not None and regex is not None:
            fail(f"target.metrics.{name}_regex", f"give {name} (a JSON key) or {name}_regex, not both")
        if regex is not None:
            where = f"target.metrics.{name}_regex"
            if not isinstance(regex, str) or not regex:
                fail(where, f"expected a regular expression (a string), got {toml_kind(regex)}")
            try:
                re.compile(regex)
            except re.error as e:
                fail(where, f"invalid regular expression: {e}")
            specs.append(MetricSpec(name, regex=regex))
            continue
        key = default if key is None else key
        if not isinstance(key, str) or not key.strip():
            fail(
                f"target.metrics.{name}",
                f"expected the key of the {name} in the job's JSON output (a string, e.g."
                f" {default!r}), got {toml_kind(key)}",
            )
        specs.append(MetricSpec(name, key=key))
    return specs[0], specs[1]


def load_job_passes(
    table: Mapping[str, Any], fail: Fail
) -> tuple[tuple[JobPass, ...], tuple[str, ...], dict[str, bool]]:
    """Check the ``[passes]`` table of a command target: the job's passes by kind.

    Args:
        table: the parsed table: ``GraphFusion`` and ``UBFusion`` (arrays of the job's pass
            names), ``not_switchable`` (names among them that stay on), ``fixed`` (name -> "on" /
            "off", held during the search).
        fail: raises the loader's one-line error.

    Returns:
        The job's pass table, the searched names (table order), the fixed switches.
    """
    for name in table:
        if name not in PASS_KEYS:
            hint = " (a command target lists the job's passes by kind)" if name == "search" else ""
            fail(f"passes.{name}", f"unknown key (known: {', '.join(PASS_KEYS)}){hint}")
    kinds: dict[str, str] = {}
    for kind in KINDS:
        names = table.get(kind, [])
        if not isinstance(names, list):
            fail(f"passes.{kind}", f"expected an array of the job's pass names, got {toml_kind(names)}")
        for i, name in enumerate(names):
            key = f"passes.{kind}[{i}]"
            if not isinstance(name, str):
                fail(key, f"expected a pass name, got {toml_kind(name)}")
            if not _PASS_NAME.fullmatch(name):
                fail(key, f"{name!r} is not a pass name (letters, digits, '_' and '-')")
            if name in kinds:
                fail(key, f"{name} is listed twice" + (f" (also under {kinds[name]})" if kinds[name] != kind else ""))
            kinds[name] = kind
    if not kinds:
        fail("passes", "missing: list the job's passes, e.g. GraphFusion = [\"SoftmaxFusionPass\"]")
    fixed_names = table.get("not_switchable", [])
    if not isinstance(fixed_names, list):
        fail("passes.not_switchable", f"expected an array of pass names, got {toml_kind(fixed_names)}")
    always_on: set[str] = set()
    for i, name in enumerate(fixed_names):
        key = f"passes.not_switchable[{i}]"
        if not isinstance(name, str) or name not in kinds:
            got = repr(name) if isinstance(name, str) else toml_kind(name)
            fail(key, f"{got} is not listed under passes.GraphFusion or passes.UBFusion")
        always_on.add(name)
    held = table.get("fixed", {})
    if not isinstance(held, dict):
        fail("passes.fixed", f'expected a table of pass = "on" / "off", got {toml_kind(held)}')
    fixed: dict[str, bool] = {}
    for name, value in held.items():
        key = f"passes.fixed.{name}"
        if name not in kinds:
            fail(key, "not listed under passes.GraphFusion or passes.UBFusion")
        if value not in ("on", "off"):
            got = repr(value) if isinstance(value, str) else toml_kind(value)
            fail(key, f'expected "on" or "off", got {got}')
        if value == "off" and name in always_on:
            fail(key, f"{name} is in passes.not_switchable: it cannot be off")
        fixed[name] = value == "on"
    passes = job_table(JobPass(name, kind, name not in always_on) for name, kind in kinds.items())
    searched = tuple(p.name for p in passes if p.switchable and p.name not in fixed)
    return passes, searched, fixed
