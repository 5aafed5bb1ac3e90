"""``fusiontune convert``: fusion_switch.cfg (JSON or line form) <-> graph_kernel_flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusiontune.cli._options import note
from fusiontune.config.flags import parse_graph_kernel_flags, render_flags
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.switch_file import (
    dump_switch_json,
    dump_switch_lines,
    load_config,
    read_text,
)
from fusiontune.errors import UserError

# Options of `convert` itself; any other `--word_with_underscore` there is a MindSpore flag.
_CONVERT_OPTIONS = ("--to", "--output", "--flags", "--minimal", "--help")


def add_parser(sub: Any) -> None:
    """Add ``convert`` to the subcommands."""
    p = sub.add_parser(
        "convert",
        help="convert between fusion_switch.cfg (JSON or line form) and graph_kernel_flags",
        description="A .cfg file (either form) or best_config.json becomes a graph_kernel_flags "
        'string by default; a flags string (an argument starting with --, or --flags "...") '
        "becomes a fusion_switch.cfg in JSON form by default.",
    )
    p.add_argument(
        "input", nargs="?", metavar="FILE_OR_FLAGS", help="a .cfg or best_config.json, or flags"
    )
    p.add_argument("--flags", help='a graph_kernel_flags string, e.g. "--disable_pass=gelu_fusion"')
    p.add_argument("--to", choices=("cfg", "lines", "flags"), help="output format (cfg: JSON form)")
    p.add_argument("--minimal", action="store_true", help="cfg / lines: ALL plus exceptions")
    p.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    p.set_defaults(func=_run)


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """Let MindSpore flag strings through argparse, which reads ``--disable_pass=x`` as an option.

    ``--flags X`` becomes ``--flags=X`` (X may start with ``--``). After ``convert``, bare
    ``--word_with_underscore[=v]`` words (and a following value) and every ``--flags`` value are
    joined into one ``--flags``.
    """
    args = list(argv)
    out: list[str] = []
    gathered: list[str] = []
    is_convert = bool(args) and args[0] == "convert"
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out += args[i:]
            break
        if word == "--flags" and i + 1 < len(args):
            word = f"--flags={args[i + 1]}"
            i += 1
        if is_convert and word.startswith("--flags="):
            gathered.append(word.removeprefix("--flags="))
            i += 1
            continue
        name = word.partition("=")[0]
        if is_convert and word.startswith("--") and "_" in name and name not in _CONVERT_OPTIONS:
            gathered.append(word)
            i += 1
            if "=" not in word and i < len(args) and not args[i].startswith("-"):
                gathered.append(args[i])
                i += 1
            continue
        out.append(word)
        i += 1
    if gathered:
        out.insert(1, f"--flags={' '.join(gathered)}")
    return out


def _read_input(file_or_flags: str | None, flags: str | None) -> tuple[FusionConfig, str]:
    """The configuration and the kind of input it came from: ``"flags"`` or ``"cfg"``."""
    if flags is not None and file_or_flags is not None:
        raise UserError("convert: give a file or a flags string, not both")
    if flags is None and file_or_flags is None:
        raise UserError('convert: give a fusion_switch.cfg file or a flags string (--flags "...")')
    if flags is not None:
        return _from_flags(flags, "graph_kernel_flags"), "flags"
    assert file_or_flags is not None
    if file_or_flags.startswith("--"):
        return _from_flags(file_or_flags, "graph_kernel_flags"), "flags"
    text = read_text(file_or_flags)
    if text.lstrip().startswith("--"):  # a saved graph_kernel_flags.txt
        return _from_flags(text, file_or_flags), "flags"
    return load_config(file_or_flags), "cfg"


def _from_flags(text: str, source: str) -> FusionConfig:
    parsed = parse_graph_kernel_flags(text, source)
    if parsed.ignored:
        note(f"ignored flags that do not switch fusion passes: {' '.join(parsed.ignored)}")
    return parsed.config


def _run(args: argparse.Namespace) -> int:
    config, kind = _read_input(args.input, args.flags)
    to = args.to or ("cfg" if kind == "flags" else "flags")
    if to == "cfg":
        text = dump_switch_json(config, minimal=args.minimal)
    elif to == "lines":
        text = dump_switch_lines(config, minimal=args.minimal)
    else:
        text = render_flags(config) + "\n"
        if text == "\n":
            note("the configuration is the registry defaults: no flags are needed")
    cut = {k: v for k, v in config.split_points.items() if v}
    if cut:
        dropped = ", ".join(f"{k}={v}" for k, v in cut.items())
        note(f"split points cannot be written as {to}; dropped {dropped} (keep best_config.json)")
    if args.output is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0
