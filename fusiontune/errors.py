"""Errors that reach the user: one line, no traceback (the CLI exits 2 on them)."""

from __future__ import annotations

import os
from pathlib import Path

MAX_USER_FILE_BYTES = 16 * 1024 * 1024
"""The largest text file a user may hand in (a cfg, a best_config.json, a search space): the
biggest real one is a few kilobytes, and reading a stray multi-gigabyte file would exhaust memory."""


class UserError(Exception):
    """Bad input from the user (a name, a size, a file); the message is one line that says the fix."""


def read_user_file(
    path: str | os.PathLike[str],
    error: type[UserError] = UserError,
    what: str = "a file",
    max_bytes: int = MAX_USER_FILE_BYTES,
) -> str:
    """Read a file the user named, turning OS errors into one-line errors of type ``error``.

    Args:
        path: the file.
        error: the UserError subclass to raise (ConfigError, SpaceError, ...).
        what: what the file should be, for the message about a directory.
        max_bytes: the largest file read; a bigger one is refused before any of it is read.

    Returns:
        Its text (a UTF-8 byte-order mark, which Windows editors add, is dropped).

    Raises:
        UserError: (of type ``error``) the file does not exist, is a directory, cannot be read,
            is larger than ``max_bytes``, or is not UTF-8.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes and p.is_file():
            raise error(
                f"{p}: {_size_text(size)}, over the {_size_text(max_bytes)} limit for {what};"
                " nothing was read"
            )
        with p.open("rb") as f:
            # One byte past the cap: a file that grew since the stat (or a pipe, whose size
            # reads 0) is still refused without holding more than the cap in memory.
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise error(f"{p}: over the {_size_text(max_bytes)} limit for {what}")
        # Newlines as text mode reads them, so line and column numbers in messages stay right.
        return data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory, expected {what}") from None
    except PermissionError:
        raise error(f"{p}: permission denied") from None
    except UnicodeDecodeError as e:
        raise error(f"{p}: not a UTF-8 text file (byte {e.start})") from None


def _size_text(n: int) -> str:
    """``n`` bytes for a person: ``2.0 GiB``, ``16 MiB``, ``512 bytes``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"
