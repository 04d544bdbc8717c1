"""The storage layer's own error type."""

from __future__ import annotations

__all__ = ["StorageError"]


class StorageError(RuntimeError):
    """A storage URL that cannot be parsed, reached or used.

    The message always names the URL with its password masked.
    """
