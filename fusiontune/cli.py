"""The ``fusiontune`` command: ``passes | run | tune | report | bisect | convert``.

Every user error (:class:`fusiontune.errors.UserError`, which :class:`ConfigError` is, or a
missing file) prints one line, ``fusiontune: error: <message>``, to stderr and exits 2, with no
traceback; argparse usage errors exit 2 too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusiontune.config.flags import parse_graph_kernel_flags, render_flags
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.switch_file import (
    dump_switch_json,
    dump_switch_lines,
    load_config,
    read_text,
)
from fusiontune.errors import UserError
from fusiontune.passes.base import KINDS, PassInfo
from fusiontune.passes.registry import PASSES

PROG = "fusiontune"
EXIT_USER_ERROR = 2
# Options of `convert` itself; any other `--word_with_underscore` there is a MindSpore flag.
_CONVERT_OPTIONS = ("--to", "--output", "--flags", "--minimal", "--help")


# ---- helpers -------------------------------------------------------------------------------------
def _note(message: str) -> None:
    print(f"{PROG}: note: {message}", file=sys.stderr)


def _assignment(text: str) -> tuple[str, int]:
    """``NAME=INT`` -> (name, value); argparse turns the ValueError into a usage error."""
    name, eq, value = text.partition("=")
    try:
        if not (eq and name):
            raise ValueError
        return name.strip(), int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=INT, got {text!r}") from None


def _shape_assignment(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=2x64`` -> (name, (2, 64)); argparse turns the ValueError into a usage error."""
    name, eq, value = text.partition("=")
    try:
        if not (eq and name.strip() and value.strip()):
            raise ValueError
        shape = tuple(int(d) for d in value.lower().split("x"))
        if any(d < 1 for d in shape):
            raise ValueError
        return name.strip(), shape
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=AxBx..., e.g. input_ids=2x64, got {text!r}") from None


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, a dashed rule under the header.

    Args:
        headers: column titles.
        rows: cells as strings, one sequence per row.

    Returns:
        The table, one line per row, no trailing spaces.
    """
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


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


def _prepare_argv(argv: Sequence[str]) -> list[str]:
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


# ---- passes --------------------------------------------------------------------------------------
def _cmd_passes(args: argparse.Namespace) -> int:
    infos = [p for p in PASSES if args.kind is None or p.kind == args.kind]
    if args.json:
        print(json.dumps([_pass_record(p) for p in infos], indent=2))
        return 0
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
    print(format_table(headers, rows))
    return 0


# ---- convert -------------------------------------------------------------------------------------
def _read_convert_input(args: argparse.Namespace) -> tuple[FusionConfig, str]:
    """The configuration and the kind of input it came from: ``"flags"`` or ``"cfg"``."""
    if args.flags is not None and args.input is not None:
        raise UserError("convert: give a file or a flags string, not both")
    if args.flags is None and args.input is None:
        raise UserError('convert: give a fusion_switch.cfg file or a flags string (--flags "...")')
    if args.flags is not None or args.input.startswith("--"):
        text = args.flags if args.flags is not None else args.input
        return _from_flags(text, "graph_kernel_flags"), "flags"
    text = read_text(args.input)
    if text.lstrip().startswith("--"):  # a saved graph_kernel_flags.txt
        return _from_flags(text, args.input), "flags"
    return load_config(args.input), "cfg"


def _from_flags(text: str, source: str) -> FusionConfig:
    parsed = parse_graph_kernel_flags(text, source)
    if parsed.ignored:
        _note(f"ignored flags that do not switch fusion passes: {' '.join(parsed.ignored)}")
    return parsed.config


def _cmd_convert(args: argparse.Namespace) -> int:
    config, kind = _read_convert_input(args)
    to = args.to or ("cfg" if kind == "flags" else "flags")
    if to == "cfg":
        text = dump_switch_json(config, minimal=args.minimal)
    elif to == "lines":
        text = dump_switch_lines(config, minimal=args.minimal)
    else:
        text = render_flags(config) + "\n"
        if text == "\n":
            _note("the configuration is the registry defaults: no flags are needed")
    cut = {k: v for k, v in config.split_points.items() if v}
    if cut:
        dropped = ", ".join(f"{k}={v}" for k, v in cut.items())
        _note(f"split points cannot be written as {to}; dropped {dropped} (keep best_config.json)")
    if args.output is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0


# ---- run -------------------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace) -> int:
    # Imported lazily so that `passes` and `convert` never pay for numba and the codegen stack.
    from fusiontune.runner import run_command

    return int(run_command(args))


# ---- tune and report -----------------------------------------------------------------------------
def _cmd_tune(args: argparse.Namespace) -> int:
    # Lazy: optuna, numba and (with workers) Ray are paid for only by the commands that use them.
    from fusiontune.tune.tune_cmd import tune_command

    return int(tune_command(args))


def _cmd_report(args: argparse.Namespace) -> int:
    from fusiontune.report.build import report_command

    return int(report_command(args))


def _cmd_bisect(args: argparse.Namespace) -> int:
    from fusiontune.bisect import bisect_command

    return int(bisect_command(args))


def _add_bisect_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bisect",
        help="find the pass, then the single fusion, that breaks the accuracy bound",
        description="Delta debugging between a configuration that breaks the space's accuracy bound"
        " (--bad; default: the registry defaults with every inexact pass on) and one that holds it"
        " (--good; default: every switchable pass off): first over the passes in which they differ,"
        " then over the applications of each culprit pass. Writes results/<name>/bisect.json,"
        " bisect.md and safe_fusion_switch.cfg (bad with only the culprits off). Exit code 0 when the"
        " safe configuration holds the bound, 1 when it does not, 2 on bad input.",
    )
    p.add_argument("space", metavar="SPACE", help="a search space file: the workload, metric and bound")
    p.add_argument("--bad", metavar="FILE", help="fusion_switch.cfg or best_config.json that loses accuracy")
    p.add_argument("--good", metavar="FILE", help="fusion_switch.cfg or best_config.json that holds the bound")
    p.add_argument("--bound", metavar="X", type=float, help="the accuracy bound (default: the space's)")
    p.add_argument("--metric", metavar="M", help="max_abs, max_rel, rel_l2 or cosine (default: the space's)")
    p.add_argument("--name", metavar="NAME", help="results/<NAME>/ (default: the space's name)")
    p.add_argument(
        "--workers", metavar="K", type=int, default=0,
        help="Ray workers; 0 (default) evaluates in this process: the search asks one question at a time",
    )
    p.add_argument("--ray-address", metavar="ADDR", help="join a running Ray cluster (with --workers K)")
    p.add_argument(
        "--replay", metavar="FILE", help="answer from a recorded study.db or bisect.json instead of measuring"
    )
    p.set_defaults(func=_cmd_bisect)


def _add_tune_parsers(sub: Any) -> None:
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
        type=int,
        help="total finished trials to reach (default: the space's)",
    )
    p.add_argument(
        "--timeout",
        metavar="DURATION",
        help='wall-time budget, e.g. "30m", "8h" (default: the space\'s)',
    )
    p.add_argument(
        "--workers",
        metavar="K",
        type=int,
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
    p.add_argument("--study", metavar="NAME", help="study name (default: the space's name)")
    p.add_argument(
        "--sampler", metavar="NAME", help="tpe, random, grid or nsga2 (default: the space's)"
    )
    p.add_argument("--seed", metavar="S", type=int, help="sampler seed (default: the space's)")
    p.add_argument(
        "--top-k",
        metavar="K",
        type=int,
        help="configurations measured again at the end (default: the space's)",
    )
    p.add_argument("--no-confirm", action="store_true", help="skip the confirmation measurements")
    p.add_argument(
        "--replay", metavar="STUDY_DB", help="answer from a recorded study instead of measuring"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_tune)

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
    p.set_defaults(func=_cmd_report)


# ---- parser and entry point ----------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Auto-tuning harness for operator fusion (CANN / MindSpore style)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("passes", help="list the fusion passes: aliases, defaults, split points")
    p.add_argument("--kind", choices=KINDS, help="only GraphFusion or only UBFusion passes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_passes)

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
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("run", help="fuse, compile and measure one workload under one configuration")
    p.add_argument(
        "workload", metavar="WORKLOAD", help="a built-in workload name, or an ONNX model file (MODEL.onnx)"
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", type=Path, help="fusion_switch.cfg or best_config.json"
    )
    source.add_argument("--flags", metavar='"..."', help="a graph_kernel_flags string")
    p.add_argument(
        "--split",
        metavar="NAME=INT",
        type=_assignment,
        action="append",
        default=[],
        help="a split point, e.g. MatMulRowSplitFusionPass.row_block=128 (repeatable)",
    )
    p.add_argument(
        "--dump-graphs", metavar="DIR", type=Path, help="write text and DOT dumps of every stage"
    )
    p.add_argument(
        "--size",
        metavar="KEY=INT",
        type=_assignment,
        action="append",
        default=[],
        help="a workload size, e.g. batch=8 (repeatable)",
    )
    p.add_argument(
        "--dim",
        metavar="NAME=INT",
        type=_assignment,
        action="append",
        default=[],
        help="an ONNX model: the size of a symbolic dimension, e.g. batch=2 (repeatable)",
    )
    p.add_argument(
        "--input-shape",
        metavar="NAME=AxB",
        type=_shape_assignment,
        action="append",
        default=[],
        help="an ONNX model: the whole shape of one input, e.g. input_ids=2x64 (repeatable); it also"
        " fixes the named dimensions it shares with other inputs",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="an ONNX model: run on these arrays (np.savez, keyed by input name; other keys ignored);"
        " their shapes fix the input shapes, and an input the file lacks is drawn at random when"
        " its shape is fixed",
    )
    p.add_argument(
        "--save-outputs",
        metavar="FILE.npz",
        help="write the fused program's outputs there, keyed by output name (np.savez format)",
    )
    p.add_argument("--repeat", metavar="N", type=int, help="timed repeats")
    p.add_argument(
        "--vs-all-off",
        action="store_true",
        help="also time the all-off program, interleaved, and print the speedup",
    )
    p.add_argument("--out", metavar="DIR", help="where fusion_result.json goes (default results/run_<workload>)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_run)

    _add_tune_parsers(sub)
    _add_bisect_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fusiontune`` command line.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, 2 on a user error (one line on stderr) or a usage error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(_prepare_argv(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # usage errors (2) and --help (0)
        return e.code if isinstance(e.code, int) else EXIT_USER_ERROR
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `fusiontune passes | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # the interpreter flushes stdout at exit: keep it quiet
        return 0
    except UserError as e:  # ConfigError included
        message = " ".join(str(e).split())
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        message = f"{e.filename}: {e.strerror}" if e.filename else str(e)
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USER_ERROR
