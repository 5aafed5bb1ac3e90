"""The ``fusiontune`` command: ``passes | convert | run | tune | report | bisect``.

A thin layer: one module per subcommand builds its parser, checks every option value at the edge
(:mod:`fusiontune.cli._options`), turns the parsed arguments into the typed options record of the
library function it calls (:class:`fusiontune.runner.RunOptions`,
:class:`fusiontune.tune.driver.TuneOptions`, :class:`fusiontune.bisect.driver.BisectOptions`,
:class:`fusiontune.report.build.ReportOptions`), and calls it. No library module imports this
package or argparse.

Every user error (:class:`fusiontune.errors.UserError`, which :class:`ConfigError` is, a bad option
value, or a missing file) prints one line, ``fusiontune: error: <file or option>: <what>``, to
stderr and exits 2, with no traceback; so does a usage error (a missing argument, an unknown
option), with a pointer to the subcommand's ``--help``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fusiontune.cli import bisect, convert, passes, report, run, tune
from fusiontune.cli._options import PROG, Parser, format_table, quiet_stdout
from fusiontune.errors import UserError

__all__ = ["EXIT_USER_ERROR", "PROG", "build_parser", "format_table", "main", "version"]

EXIT_USER_ERROR = 2


def version() -> str:
    """The installed distribution's version, or the package's own when it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("fusiontune")
    except PackageNotFoundError:
        import fusiontune

        return str(getattr(fusiontune, "__version__", "unknown"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand (exposed for tests and docs)."""
    parser = Parser(
        prog=PROG, description="Auto-tuning harness for operator fusion (CANN / MindSpore style)."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (passes, convert, run, tune, report, bisect):
        module.add_parser(sub)
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
        try:
            args = parser.parse_args(convert.prepare_argv(sys.argv[1:] if argv is None else argv))
        except SystemExit as e:  # --help and --version (0)
            return e.code if isinstance(e.code, int) else EXIT_USER_ERROR
        return int(args.func(args))
    except BrokenPipeError:  # `fusiontune passes | head`: the reader left, nothing to report
        quiet_stdout()  # the interpreter flushes stdout at exit: keep it quiet
        return 0
    except UserError as e:  # ConfigError and the option checks included
        message = " ".join(str(e).split())
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        message = f"{e.filename}: {e.strerror}" if e.filename else str(e)
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USER_ERROR
