"""Reloading the mapping file when a search rewrites it, without a restart.

Searches write the mapping atomically (a temporary file renamed over the old one), so a
change shows in the file's inode, modification time or size; checking those costs one
``stat`` per request. A new file is loaded and checked against the loaded model; a mapping
for another model (or a corrupt one) is refused, the old one kept, and that is logged once
per change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from tss_opt.runtime.controller import TSSController

__all__ = ["MappingReloader"]

log = logging.getLogger(__name__)

Signature = tuple[int, int, int] | None


def _signature(path: Path) -> Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class MappingReloader:
    """Keeps the served controller in step with the mapping file.

    Args:
        controller: The controller serving now (its mapping read from ``path``).
        path: The mapping file.
        on_result: Called with ``"ok"`` or ``"refused"`` after each reload attempt (metrics).
    """

    def __init__(self, controller: TSSController, path: str | os.PathLike[str], on_result: Callable[[str], None] | None = None) -> None:
        self.controller = controller
        self.path = Path(path)
        self.on_result = on_result
        self._seen = _signature(self.path)
        self.last_error: str | None = None

    def check(self) -> TSSController:
        """The controller to serve the next request with: a new one when the file changed
        and its mapping is valid for the loaded model, else the current one."""
        sig = _signature(self.path)
        if sig == self._seen:
            return self.controller
        self._seen = sig
        if sig is None:
            log.warning("mapping %s disappeared; still serving the mapping loaded before", self.path)
            return self.controller
        try:
            new = self.controller.with_mapping(self.path)
        except ValueError as e:  # MappingError, or an entry the model cannot run
            self.last_error = str(e)
            log.warning("mapping %s changed but was refused; still serving the previous one: %s", self.path, e)
            if self.on_result:
                self.on_result("refused")
            return self.controller
        old = set(self.controller.domains)
        self.controller, self.last_error = new, None
        log.info(
            "mapping %s reloaded: %d domain(s) (%s)%s", self.path, len(new.domains), ", ".join(new.domains) or "none",
            "" if set(new.domains) == old else f"; before: {', '.join(sorted(old)) or 'none'}",
        )
        if self.on_result:
            self.on_result("ok")
        return self.controller
