"""The project's user errors: one base class, caught by every command (one line, exit 2)."""

from __future__ import annotations

__all__ = ["TSSError", "UsageError"]


class TSSError(ValueError):
    """A problem the user fixes (input, configuration, data, storage); the message names the
    value, what was expected and the fix. Subclasses ``ValueError`` so existing handlers keep
    working."""


class UsageError(TSSError):
    """A command-line configuration the user must fix."""
