"""Write a model folder once, atomically, even with other processes writing the same one.

Two processes may convert the same model at the same time (two test suites in CI, several
workers of one study starting together). Each writes into a folder of its own beside the
target and renames it into place; the first rename wins and the others discard their copy, so
no reader ever sees a half-written folder and no writer deletes a folder another is reading.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def staging_dir(out: Path) -> Path:
    """A new empty folder beside ``out``, for this process only."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".partial-"))


def publish_dir(tmp: Path, out: Path, complete: Callable[[Path], bool]) -> None:
    """Move the written folder ``tmp`` to ``out``; keep an ``out`` that is already ``complete``.

    An incomplete ``out`` (written by an older, non-atomic version) is replaced.
    """
    if out.exists() and not complete(out):
        shutil.rmtree(out, ignore_errors=True)
    try:
        tmp.rename(out)  # atomic on one file system
    except OSError:
        if not complete(out):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process published first
