"""The project's user errors: one base class, caught by every command.

Each module keeps its own error class (``StorageError``, ``ModelLoadError``, ``DomainError``,
``MappingError``, ``SearchSettingsError``, ``EvaluatorError``, ``UsageError``...), all derived
from :class:`TSSError`. A command prints such an error as one line, ``error: <message>``,
and exits with status 2 (see ``tss_opt.cli.common.hydra_entry``); anything else is a bug and
keeps its traceback. Messages name the value, what was expected and the fix, with storage
URLs masked (:func:`tss_opt.storage.mask_url`).

``TSSError`` subclasses ``ValueError`` so code that caught ``ValueError`` before keeps working.
"""

from __future__ import annotations

__all__ = ["TSSError", "UsageError"]


class TSSError(ValueError):
    """A problem the user can fix (configuration, data, storage, model files)."""


class UsageError(TSSError):
    """A command-line configuration the user must fix."""
