"""The storage layer's own error type."""

from __future__ import annotations

from tss_opt.errors import TSSError

__all__ = ["StorageError"]


class StorageError(TSSError):
    """A storage URL that cannot be parsed, reached or used.

    The message always names the URL with its password masked.
    """
