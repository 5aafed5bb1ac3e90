"""CANN ``fusion_switch.cfg``: read and write its JSON form and its line form.

JSON form (what ATC, GE and TorchAir read)::

    {"Switch": {"GraphFusion": {"ALL": "off", "SoftmaxFusionPass": "on"},
                "UBFusion": {"ALL": "off"}}}

Line form: one ``PassName:on`` / ``PassName:off`` per line; ``ALL:off`` (both sections),
``GraphFusion.ALL:off`` / ``UBFusion.ALL:off`` (one section); ``#`` comments and blank lines.

Both resolve CANN's way (:meth:`FusionConfig.resolve`): registry defaults, then ``ALL`` of each
section, then the named passes, whatever order they are written in. Non-switchable passes stay on.
MindSpore aliases are accepted when reading; files are always written with CANN names. Split
points never go into the cfg, which must stay loadable by CANN tools: they live in the
``best_config.json`` sidecar (:meth:`FusionConfig.to_json`), and :func:`load_config` reads either.

Given a job's pass table (``passes``, a command target's :class:`JobPass` rows), a file is read
against that table instead of the registry: the names are the job's, exactly as it spells them.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fusiontune.config.fusion_config import ConfigError, FusionConfig, JobPass
from fusiontune.errors import read_user_file
from fusiontune.passes.base import KINDS, PassInfo
from fusiontune.passes.registry import closest, lookup

_ON_OFF = {"on": True, "off": False}
_BEST_CONFIG_KEYS = frozenset(KINDS) | {"split_points"}

MAX_JSON_DEPTH = 8
"""The deepest nesting of objects and lists a configuration file may have. A fusion_switch.cfg
nests 3 levels (Switch, section, pass), a best_config.json 2, a fusion_result.json 4; refusing
deeper files before decoding keeps a pathological one from exhausting the recursion limit of
the JSON decoder (and of every reader after it)."""

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?')  # an unterminated one runs to the end
_JSON_TOKEN = re.compile(_JSON_STRING.pattern + r"|[\[\]{}]")
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object kept as its (key, value) pairs, so duplicate keys can be reported."""


# ---- reading -------------------------------------------------------------------------------------
def read_text(path: str | os.PathLike[str]) -> str:
    """Read a configuration file as text, turning OS errors into one-line ConfigErrors.

    Args:
        path: the file.

    Returns:
        Its text (a UTF-8 byte-order mark, which Windows editors add, is dropped).

    Raises:
        ConfigError: the file does not exist, is a directory, cannot be read, is over the size
            limit (:data:`fusiontune.errors.MAX_USER_FILE_BYTES`), or is not UTF-8.
    """
    return read_user_file(path, ConfigError, "a configuration file")


def load_switch_file(
    path: str | os.PathLike[str], passes: Sequence[JobPass] | None = None
) -> FusionConfig:
    """Read a ``fusion_switch.cfg`` in either form (detected from its first character).

    Args:
        path: the cfg file.
        passes: a job's pass table to read it against (None: the registry).

    Returns:
        The resolved configuration; split points at 0.

    Raises:
        ConfigError: one line naming the file and the key that is wrong.
    """
    return loads_switch(read_text(path), str(path), passes)


def loads_switch(
    text: str, source: str = "fusion_switch.cfg", passes: Sequence[JobPass] | None = None
) -> FusionConfig:
    """Parse the text of a ``fusion_switch.cfg``: JSON form if it starts with ``{``, else line form.

    Args:
        text: the file's content.
        source: the file name used in error messages.
        passes: a job's pass table to read it against (None: the registry).

    Returns:
        The resolved configuration; split points at 0.

    Raises:
        ConfigError: malformed JSON (with line and column), a missing ``Switch`` key, an unknown
            section or pass (with the closest known names), a pass in the wrong section, a value
            other than "on"/"off", an explicit off of a non-switchable pass, or conflicting entries.
    """
    if text.lstrip().startswith(("{", "[")):
        return _from_json(decode_json(text, source), source, passes)
    return _from_lines(text, source, passes)


def load_config(
    path: str | os.PathLike[str],
    splits: Mapping[str, int] | None = None,
    passes: Sequence[JobPass] | None = None,
) -> FusionConfig:
    """Read a ``fusion_switch.cfg`` (either form) or a ``best_config.json``, plus split points.

    Args:
        path: a cfg file, or a ``best_config.json`` written by :meth:`FusionConfig.to_json`
            (recognised by its top-level ``GraphFusion`` / ``UBFusion`` / ``split_points`` keys).
        splits: extra split points, ``"Pass.point" -> value``, that override the file's; the pass
            may be named by its MindSpore alias.
        passes: a job's pass table: the file names the job's passes (a cfg, or a
            ``best_config.json`` of a command target); None: the registry.

    Returns:
        The resolved configuration.

    Raises:
        ConfigError: anything wrong in the file or the split points, in one line.
    """
    source = str(path)
    text = read_text(path)
    if text.lstrip().startswith(("{", "[")):
        data = decode_json(text, source)
        keys = {k for k, _ in data} if isinstance(data, _Pairs) else set()
        if "Switch" not in keys and keys & _BEST_CONFIG_KEYS:
            config = FusionConfig.from_json(_plain(data), source)
            if passes is not None and config.passes is None:
                config = FusionConfig.resolve(
                    explicit=dict(config.switches), source=source, passes=passes
                )
        else:
            config = _from_json(data, source, passes)
    else:
        config = _from_lines(text, source, passes)
    if not splits:
        return config
    merged = dict(config.split_points)
    for key, value in splits.items():
        pass_name, dot, point = key.partition(".")
        info = lookup(pass_name)
        merged[f"{info.name}.{point}" if info and dot else key] = value
    return FusionConfig.resolve(
        explicit=dict(config.switches), split_points=merged, source=f"{source} + split points"
    )


def decode_json(text: str, source: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` with objects kept as pairs, after a check of the nesting depth.

    Args:
        text: the file's content.
        source: the file name used in error messages.
        max_depth: the deepest nesting of objects and lists accepted.

    Returns:
        The decoded value, objects as lists of (key, value) pairs.

    Raises:
        ConfigError: nesting deeper than ``max_depth`` (with the line and column where it goes
            deeper), or malformed JSON (with line and column).
    """
    check_json_depth(text, source, max_depth)
    try:
        return json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None


def check_json_depth(text: str, source: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON text that nests objects and lists deeper than ``max_depth``, without decoding it.

    Strings are blanked out first (a bracket inside a string does not nest), then the running
    depth of the brackets left is summed in C (``itertools.accumulate``), so a 16 MiB file costs
    a few regular-expression passes, never a recursion.

    Args:
        text: the JSON text (well-formed or not: unbalanced brackets are left to the decoder,
            unless they already go too deep).
        source: the file name used in the message.
        max_depth: the deepest nesting accepted.

    Raises:
        ConfigError: ``source:line:col: nested deeper than N levels ...``, pointing at the
            bracket that opens level N + 1.
    """
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub('""', text))
    steps = map(_DEPTH_STEP.__getitem__, brackets)
    if not brackets or max(itertools.accumulate(steps)) <= max_depth:
        return
    depth, offset = 0, len(text)
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        depth += _DEPTH_STEP[token]
        if depth > max_depth:
            offset = match.start()
            break
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    raise ConfigError(
        f"{source}:{line}:{col}: nested deeper than {max_depth} levels of objects and lists"
        " (a fusion_switch.cfg has 3: Switch, section, pass); nothing was decoded"
    )


def _plain(value: Any) -> Any:
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _describe(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)


def _object(value: Any, key: str, source: str) -> list[tuple[str, Any]]:
    if not isinstance(value, _Pairs):
        raise ConfigError(f"{source}: {key}: expected an object, got {_describe(value)}")
    seen: set[str] = set()
    for k, _ in value:
        if k in seen:
            raise ConfigError(f"{source}: {key}.{k}: duplicate key")
        seen.add(k)
    return list(value)


def _pass_hint(name: str) -> str:
    found = [info.name for n in closest(name, n=6) if (info := lookup(n)) is not None]
    return ", ".join(list(dict.fromkeys(found))[:3]) or "none"


class _Switches:
    """ALL values and explicit entries as a file states them, checked as they arrive."""

    def __init__(
        self, source: str, section_prefix: str, passes: Sequence[JobPass] | None = None
    ) -> None:
        self.source = source
        self.section_prefix = section_prefix
        self.passes = None if passes is None else tuple(passes)
        self.job = {p.name: p for p in self.passes or ()}
        self.all: dict[str, tuple[bool, str]] = {}
        self.explicit: dict[str, tuple[bool, str]] = {}

    def value(self, raw: Any, key: str) -> bool:
        if not isinstance(raw, str) or raw not in _ON_OFF:
            raise ConfigError(f'{self.source}: {key}: expected "on" or "off", got {_describe(raw)}')
        return _ON_OFF[raw]

    def set_all(self, kind: str, on: bool, key: str, label: str | None = None) -> None:
        before = self.all.get(kind)
        if before is not None and before[0] != on:
            raise ConfigError(f"{self.source}: {key}: conflicts with {before[1]}")
        self.all[kind] = (on, label or key)

    def set_pass(
        self, name: str, section: str | None, on: bool, key: str, label: str | None = None
    ) -> None:
        info: PassInfo | JobPass | None = lookup(name) if self.passes is None else self.job.get(name)
        if info is None and self.passes is not None:
            close = difflib.get_close_matches(name, list(self.job), n=3, cutoff=0.5)
            raise ConfigError(
                f"{self.source}: {key}: not a pass of the job's table (closest: "
                f"{', '.join(close) or 'none'})"
            )
        if info is None:
            raise ConfigError(
                f"{self.source}: {key}: unknown pass (closest known: {_pass_hint(name)})"
            )
        if section is not None and section != info.kind:
            raise ConfigError(
                f"{self.source}: {key}: {info.name} is a {info.kind} pass; "
                f"it belongs under {self.section_prefix}{info.kind}"
            )
        if not on and not info.switchable:
            raise ConfigError(
                f"{self.source}: {key}: {info.name} cannot be switched off: it is needed for "
                'correctness ("ALL":"off" leaves it on)'
            )
        before = self.explicit.get(info.name)
        if before is not None and before[0] != on:
            raise ConfigError(f"{self.source}: {key}: conflicts with {before[1]}")
        self.explicit[info.name] = (on, label or key)

    def resolve(self) -> FusionConfig:
        return FusionConfig.resolve(
            all_switch={k: on for k, (on, _) in self.all.items()},
            explicit={k: on for k, (on, _) in self.explicit.items()},
            source=self.source,
            passes=self.passes,
        )


def _from_json(data: Any, source: str, passes: Sequence[JobPass] | None = None) -> FusionConfig:
    top = _object(data, "top level", source)
    keys = [k for k, _ in top]
    if "Switch" not in keys:
        found = ", ".join(keys) or "none"
        raise ConfigError(
            f'{source}: Switch: missing key (expected {{"Switch":{{"GraphFusion":{{...}},'
            f'"UBFusion":{{...}}}}}}, found keys: {found})'
        )
    for k in keys:
        if k != "Switch":
            raise ConfigError(f'{source}: {k}: unknown key (the only top-level key is "Switch")')
    switches = _Switches(source, "Switch.", passes)
    for section, body in _object(dict(top)["Switch"], "Switch", source):
        key = f"Switch.{section}"
        if section not in KINDS:
            raise ConfigError(
                f"{source}: {key}: unknown section (expected GraphFusion or UBFusion)"
            )
        for name, raw in _object(body, key, source):
            on = switches.value(raw, f"{key}.{name}")
            if name == "ALL":
                switches.set_all(section, on, f"{key}.ALL")
            else:
                switches.set_pass(name, section, on, f"{key}.{name}")
    return switches.resolve()


def _from_lines(text: str, source: str, passes: Sequence[JobPass] | None = None) -> FusionConfig:
    switches = _Switches(source, "", passes)
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        name, sep, raw = (part.strip() for part in line.partition(":"))
        if not sep or not name:
            raise ConfigError(f"{where}: expected PassName:on or PassName:off, got {line!r}")
        switches.source = where
        on = switches.value(raw, name)
        section, _, pass_name = name.rpartition(".")
        if section and section not in KINDS:
            raise ConfigError(
                f"{where}: {name}: unknown section {section!r} (expected GraphFusion or UBFusion)"
            )
        if pass_name == "ALL":
            for kind in (section,) if section else KINDS:
                switches.set_all(kind, on, name, f"{name} (line {lineno})")
        else:
            switches.set_pass(pass_name, section or None, on, name, f"{name} (line {lineno})")
    switches.source = source
    return switches.resolve()


# ---- writing -------------------------------------------------------------------------------------
def _sections(config: FusionConfig, minimal: bool) -> dict[str, dict[str, str]]:
    """Per kind: every switchable pass, or (minimal) ALL = the majority value plus exceptions.

    The minimal form always states ALL, so it means the same to a CANN tool whose own defaults
    differ from this registry's. A job configuration is always written in full: to the job,
    ``"ALL"`` would also switch the many passes it has that the search space does not list.
    """
    out: dict[str, dict[str, str]] = {}
    for kind in KINDS:
        passes = [p for p in config.pass_rows() if p.kind == kind and p.switchable]
        states = {p.name: config.switches[p.name] for p in passes}
        if not minimal or config.is_job:
            out[kind] = {name: "on" if on else "off" for name, on in states.items()}
            continue
        if not passes:
            out[kind] = {}
            continue
        all_on = 2 * sum(states.values()) >= len(states)
        section = {"ALL": "on" if all_on else "off"}
        section.update({n: "on" if on else "off" for n, on in states.items() if on != all_on})
        out[kind] = section
    return out


def dump_switch_json(config: FusionConfig, minimal: bool = False) -> str:
    """Render the JSON form of ``fusion_switch.cfg``.

    Args:
        config: the configuration; its split points are not written (see module docstring).
        minimal: False: every switchable pass explicitly, in registry order. True: the shortest
            equivalent, ``"ALL"`` (the majority value) plus the exceptions, per section.

    Returns:
        Pretty-printed JSON ending in a newline; loading it gives back ``config``'s switches.
    """
    return json.dumps({"Switch": _sections(config, minimal)}, indent=4) + "\n"


def dump_switch_lines(config: FusionConfig, minimal: bool = False) -> str:
    """Render the line form of ``fusion_switch.cfg``: one ``PassName:on|off`` per line.

    Args:
        config: the configuration; its split points are not written.
        minimal: write ``GraphFusion.ALL:x`` / ``UBFusion.ALL:x`` plus the exceptions instead of
            every switchable pass.

    Returns:
        The text, ending in a newline (no comments, so stricter readers accept it too).
    """
    lines = []
    for kind, section in _sections(config, minimal).items():
        for name, value in section.items():
            lines.append(f"{kind}.ALL:{value}" if name == "ALL" else f"{name}:{value}")
    return "\n".join(lines) + "\n"


def write_switch_file(
    config: FusionConfig,
    path: str | os.PathLike[str],
    *,
    form: str = "json",
    minimal: bool = False,
) -> Path:
    """Write ``config`` as a ``fusion_switch.cfg`` (``form``: ``"json"`` or ``"lines"``).

    Args:
        config: the configuration; split points are not written.
        path: the file to write; its folder is created.
        form: ``"json"`` (what CANN reads) or ``"lines"``.
        minimal: ALL plus exceptions instead of every pass.

    Returns:
        The path written.
    """
    if form not in ("json", "lines"):
        raise ValueError(f"form must be 'json' or 'lines', got {form!r}")
    dump = dump_switch_json if form == "json" else dump_switch_lines
    text = dump(config, minimal)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p
