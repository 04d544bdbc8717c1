"""What every measured cost table shares: what it holds for, how busy the host was, where it
is cached and how it is loaded or measured once.

The verification-latency table (:class:`~tss_opt.decoding.sizing.latency.LatencyTable`) and
the batch-latency table (:class:`~tss_opt.decoding.batch_budget.BatchLatency`) differ only in
their grid; both are :class:`MeasuredTable` and go through :func:`load_or_measure`.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tss_opt.errors import TSSError

log = logging.getLogger(__name__)


class TreeSizingError(TSSError):
    """A latency table or acceptance profile is malformed or missing values."""


def was_busy(load: float | None, cpus: int | None) -> bool:
    """The rule for every measured table: more runnable work (1-minute load average) than CPUs
    when it was measured (unknown: not busy)."""
    return load is not None and cpus is not None and load > cpus


def host_load() -> tuple[float | None, int | None]:
    """(1-minute load average, CPU count) of this host; ``(None, count)`` where the platform
    has no load average."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return load, os.cpu_count()


def utc_now() -> str:
    """The ``measured_at`` stamp: ISO date-time, UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True, kw_only=True)
class MeasuredTable:
    """The provenance of a measured table (a subclass adds its grid of seconds).

    Attributes:
        key: what the measurement holds for: ``machine``, ``model``, ``dtype``, ``device``
            (``sizing.latency.hardware_key``).
        measured_at: ISO date-time (UTC) of the measurement.
        load: the host's 1-minute load average when the measurement started (``None``: not
            recorded, e.g. a table written by hand or by an older version).
        cpus: the host's CPU count then (what ``load`` is compared with).
        prefix_len: the cached context (tokens) the forwards ran on.
    """

    key: Mapping[str, str] = field(default_factory=dict)
    measured_at: str = ""
    load: float | None = None
    cpus: int | None = None
    prefix_len: int = 64

    @property
    def busy(self) -> bool:
        """Whether the host was busy when this was measured: more runnable work (1-minute load
        average) than CPUs. Such a table describes contention, not the machine: on the 2-core
        CPU of docs/engine.md, one node cost 1.8x a plain step at load 6-8 and 0.97x at 2.6."""
        return was_busy(self.load, self.cpus)

    def to_dict(self) -> dict[str, Any]:
        """The table as stored (JSON-ready): its grid and :meth:`provenance`."""
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        """The provenance fields as stored in the table's JSON."""
        return {"key": dict(self.key), "measured_at": self.measured_at, "load": self.load, "cpus": self.cpus,
                "prefix_len": self.prefix_len}

    @staticmethod
    def provenance_from(data: Mapping[str, Any]) -> dict[str, Any]:
        """The provenance keyword arguments read back from a table's JSON (absent: defaults)."""
        load, cpus = data.get("load"), data.get("cpus")
        return {
            "key": dict(data.get("key", {})), "measured_at": str(data.get("measured_at", "")),
            "load": None if load is None else float(load), "cpus": None if cpus is None else int(cpus),
            "prefix_len": int(data.get("prefix_len", 64)),
        }


def table_path(kind: str, key: Mapping[str, str], directory: Path, prefix_len: int = 64) -> Path:
    """``<directory>/<kind>-<model>-<dtype>-<device>-<machine>[-ctx<n>].json``."""
    slug = "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", key[k]) for k in ("model", "dtype", "device", "machine"))
    # The 64-token table keeps its original name (tables cached before contexts existed).
    ctx = "" if prefix_len == 64 else f"-ctx{prefix_len}"
    return directory / f"{kind}-{slug}{ctx}.json"


_WARNED: set[Path] = set()  # once per file and process: every drafter build reads the table


def warn_if_busy(table: MeasuredTable, path: Path) -> None:
    if table.busy and path not in _WARNED:
        _WARNED.add(path)
        log.warning(
            "the measured table %s was measured at load %.1f on %d CPUs: it describes a busy machine, "
            "and the trees sized from it may speculate less (or more) than this machine pays for; "
            "delete the file and run again on a quiet machine to measure it anew",
            path, table.load, table.cpus,
        )


T = TypeVar("T", bound=MeasuredTable)


def load_or_measure(
    path: Path,
    parse: Callable[[Mapping[str, Any]], T],
    measure: Callable[[], T],
    key: Mapping[str, str] | None = None,
) -> T:
    """The table cached at ``path``, else ``measure()`` saved there (a damaged file is
    measured again and overwritten); a table measured on a busy host is warned about once.

    ``key``: what the table must hold for (``sizing.latency.hardware_key``). The file name is
    made from the key, but a file copied or renamed by hand (or two keys whose names differ
    only in punctuation) could still hold another precision's or machine's seconds: a stored
    key that differs from ``key`` in any field is measured again and overwritten (a float32
    table never sizes a bfloat16 run: on the 2-core development CPU one SmolLM2 forward of
    1 / 8 / 64 new tokens took 51 / 104 / 182 ms in float32 and 64 / 50 / 76 ms in bfloat16,
    so the two precisions want different trees). A table that stored no key (written by hand)
    is trusted."""
    if path.is_file():
        try:
            table = parse(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TreeSizingError):
            pass
        else:
            stale = key is not None and bool(table.key) and dict(table.key) != dict(key)
            if not stale:
                warn_if_busy(table, path)
                return table
            log.warning(
                "the measured table %s holds for %s, not for this target (%s); measuring it again",
                path, dict(table.key), dict(key or {}),
            )
    log.info("measuring %s once (cached in %s)", path.stem, path.parent)
    table = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table.to_dict(), indent=1) + "\n", encoding="utf-8")
    warn_if_busy(table, path)
    return table
