"""Reading and writing mapping files safely with several writers.

A write is read-modify-write under an exclusive ``fcntl.flock`` on a side lock file
(``<file>.lock``), then an atomic replace (temp file in the same folder, ``fsync``,
``os.replace``): readers see the old or the new file, never half of one, and two processes
writing different domains keep both. A corrupt existing file is never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import yaml

from tss_opt.mapping.format import DomainMapping, MappingEntry, MappingError, mapping_from_data
from tss_opt.storage import file_lock

__all__ = ["DEFAULT_MAPPING_PATH", "load_mapping", "write_entry"]

DEFAULT_MAPPING_PATH = "storage/mapping.yaml"

_HEADER = (
    "# tss_opt skip-set mapping: domain -> selected target layers to skip (see docs/mapping.md).\n"
    "# Written by tss_opt.mapping; edits are validated when the file is loaded.\n"
)


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def load_mapping(path: str | os.PathLike[str] = DEFAULT_MAPPING_PATH) -> DomainMapping:
    """Read and validate a mapping file.

    Raises:
        MappingError: The file is missing, not YAML, or fails validation (the message names
            the file and the offending field).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise MappingError(
            f"Mapping file {path} does not exist; run the search and export it "
            "(tss_opt.mapping.export_mapping) or point to the right file."
        ) from e
    except OSError as e:
        raise MappingError(f"Cannot read mapping file {path}: {e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MappingError(f"Mapping file {path} is not valid YAML: {e}") from e
    if data is None:
        raise MappingError(f"Mapping file {path} is empty; delete it or restore it from a backup.")
    return mapping_from_data(data, path)


def write_entry(path: str | os.PathLike[str], entry: MappingEntry) -> DomainMapping:
    """Add or replace ``entry`` in the mapping file at ``path``, keeping the other domains.

    Returns:
        The mapping as written.

    Raises:
        MappingError: The existing file is corrupt (it is left untouched) or is for another
            model.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_path(path)):
        current = load_mapping(path) if path.exists() else DomainMapping(path=path)
        updated = current.with_entry(entry)
        text = _HEADER + yaml.safe_dump(updated.to_data(), sort_keys=False, allow_unicode=True)
        # Round-trip check before replacing anything: what we write must load back.
        mapping_from_data(yaml.safe_load(text), path)
        _atomic_write(path, text)
    return DomainMapping(
        model=updated.model, num_layers=updated.num_layers, entries=updated.entries, path=path
    )


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file private (0600); a mapping is meant to be read by others.
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
