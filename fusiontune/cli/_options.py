"""What every subcommand shares: the checks of option values, notes, and the output table.

Every option value is checked here, at the edge, by an argparse ``type``: a bad value raises an
:class:`OptionError` (a :class:`~fusiontune.errors.UserError`, which argparse lets through, unlike
a ``ValueError``), and :func:`fusiontune.cli.main` prints it as one line,
``fusiontune: error: <option>: <what>``, exit 2. Usage errors take the same form (:class:`Parser`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

from fusiontune.errors import UserError

PROG = "fusiontune"


class OptionError(UserError):
    """A bad option value. Deliberately not a ``ValueError``: argparse turns those raised by a
    ``type`` into a multi-line usage error, and lets this one through to :func:`main`."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line too: ``<option>: <what> (see --help)``.

    argparse prints the usage and ``prog sub: error: argument --x: ...``; this raises an
    :class:`OptionError` instead, which :func:`fusiontune.cli.main` prints as
    ``fusiontune: error: --x: ...`` (its subcommands' parsers are of this class too).
    """

    def error(self, message: str) -> typing.NoReturn:
        message = re.sub(r"^argument ([^:]+): ", r"\1: ", message)
        missing = re.fullmatch(r"(?:-\w/)?(--[\w-]+): expected one argument", message)
        if missing:  # `--bound -1e-3`: argparse took the value for an option
            option = missing.group(1)
            message += f"; a value that starts with '-' is written {option}=VALUE"
        raise OptionError(f"{message} (see `{self.prog} --help`)")


def note(message: str) -> None:
    """One ``fusiontune: note:`` line on stderr."""
    print(f"{PROG}: note: {message}", file=sys.stderr)


def _int(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"{option}: expected an integer, got {text!r}") from None


def int_at_least(option: str, low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``, else one line naming ``option``."""

    def parse(text: str) -> int:
        value = _int(option, text)
        if value < low:
            raise OptionError(f"{option}: must be >= {low}, got {value}")
        return value

    return parse


def positive_finite(option: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (``nan``, ``inf``, 0 and negatives are refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise OptionError(f"{option}: expected a number, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise OptionError(f"{option}: must be a finite number > 0, got {text}")
        return value

    return parse


def duration(option: str) -> Callable[[str], float]:
    """An argparse type: a positive duration (``30m``, ``8h``, ``1h30m``, seconds) in seconds."""

    def parse(text: str) -> float:
        from fusiontune.workloads.space import parse_duration

        try:
            return parse_duration(text, option)
        except UserError as e:  # a SpaceError is a ValueError too: argparse would swallow it
            raise OptionError(str(e)) from None

    return parse


def study_name(option: str) -> Callable[[str], str]:
    """An argparse type: a name that becomes ``results/<name>/``, by the rule of a space's ``name``.

    Letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit: no ``/``, so no
    absolute path, no ``..`` and no subfolder can escape ``results/``.
    """

    def parse(text: str) -> str:
        from fusiontune.workloads.space import STUDY_NAME_RULE, is_study_name

        if not is_study_name(text):
            raise OptionError(
                f"{option}: expected a study name of {STUDY_NAME_RULE} (it names the folder"
                f" results/<name>/), got {text!r}"
            )
        return text

    return parse


def existing_file(option: str, allow_url: bool = False) -> Callable[[str], str]:
    """An argparse type: a file that exists (or, with ``allow_url``, a ``scheme://`` URL)."""

    def parse(text: str) -> str:
        if allow_url and "://" in text:
            return text
        path = Path(text)
        if not path.exists():
            raise OptionError(f"{option}: {text}: no such file")
        if path.is_dir():
            raise OptionError(f"{option}: {text}: is a directory, expected a file")
        return text

    return parse


def assignment(option: str, low: int) -> Callable[[str], tuple[str, int]]:
    """An argparse type: ``NAME=INT`` with INT >= ``low`` -> ``(name, value)``."""

    def parse(text: str) -> tuple[str, int]:
        name, eq, value = text.partition("=")
        name = name.strip()
        try:
            if not (eq and name):
                raise ValueError
            number = int(value)
        except ValueError:
            raise OptionError(f"{option}: expected NAME=INT, got {text!r}") from None
        if number < low:
            raise OptionError(f"{option}: {name} must be >= {low}, got {number}")
        return name, number

    return parse


def shape_assignment(option: str) -> Callable[[str], tuple[str, tuple[int, ...]]]:
    """An argparse type: ``NAME=2x64`` -> ``(name, (2, 64))``, every dimension >= 1."""

    def parse(text: str) -> tuple[str, tuple[int, ...]]:
        name, eq, value = text.partition("=")
        name = name.strip()
        try:
            if not (eq and name and value.strip()):
                raise ValueError
            shape = tuple(int(d) for d in value.lower().split("x"))
        except ValueError:
            raise OptionError(
                f"{option}: expected NAME=AxBx..., e.g. input_ids=2x64, got {text!r}"
            ) from None
        if any(d < 1 for d in shape):
            raise OptionError(
                f"{option}: every dimension of {name} must be >= 1, got {value.strip()}"
            )
        return name, shape

    return parse


def path_or_none(text: str | None) -> Path | None:
    """``Path(text)``, or None."""
    return None if text is None else Path(text)


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


def quiet_stdout() -> None:
    """The reader of stdout left (``fusiontune passes | head``): keep the exit flush quiet."""
    sys.stdout = open(os.devnull, "w")
