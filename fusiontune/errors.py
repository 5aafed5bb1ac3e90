"""Errors that reach the user: one line, no traceback (the CLI exits 2 on them)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a name, a size, a file); the message is one line that says the fix."""
