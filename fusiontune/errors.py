"""Errors that reach the user: one line, no traceback (the CLI exits 2 on them)."""

from __future__ import annotations

import os
from pathlib import Path


class UserError(Exception):
    """Bad input from the user (a name, a size, a file); the message is one line that says the fix."""


def read_user_file(path: str | os.PathLike[str], error: type[UserError] = UserError, what: str = "a file") -> str:
    """Read a file the user named, turning OS errors into one-line errors of type ``error``.

    Args:
        path: the file.
        error: the UserError subclass to raise (ConfigError, SpaceError, ...).
        what: what the file should be, for the message about a directory.

    Returns:
        Its text (a UTF-8 byte-order mark, which Windows editors add, is dropped).

    Raises:
        UserError: (of type ``error``) the file does not exist, is a directory, cannot be read,
            or is not UTF-8.
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory, expected {what}") from None
    except PermissionError:
        raise error(f"{p}: permission denied") from None
    except UnicodeDecodeError as e:
        raise error(f"{p}: not a UTF-8 text file (byte {e.start})") from None
