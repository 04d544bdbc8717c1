"""The error of drafter configuration, shared by the registry and the drafters it builds
(its own module so that neither imports the other for it)."""

from __future__ import annotations

from tss_opt.errors import TSSError

__all__ = ["DrafterConfigError"]


class DrafterConfigError(TSSError):
    """A drafter config names an unknown drafter or gives settings it does not take."""
