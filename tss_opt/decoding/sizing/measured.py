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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tss_opt.errors import TSSError

log = logging.getLogger(__name__)


class TreeSizingError(TSSError):
    """A latency table or acceptance profile is malformed or missing values."""


# The share of the host's CPUs that other processes may use while a table is measured before
# the table is called busy: 0.5 cores on a 2-core host. One competing single-threaded process
# takes about 1.0; an idle host's services (databases, brokers) took under 0.05 here. Why a
# threshold on the window itself and not only the load average: on the 2-core Xeon of
# docs/results (round 5), a test module on the other core made a plain step 54.7 ms instead of
# 40.6 and one node 83.7 ms instead of 43.7, at a 1-minute load of 1.0-1.24, which the load rule
# (load above the CPU count) calls quiet. A share, not a count: on a host of many cores one
# other process neither takes this one's core nor most of the memory bandwidth.
OTHERS_BUSY_SHARE = 0.25
MIN_WINDOW_S = 0.1


def others_limit(cpus: int | None) -> float:
    """Cores' worth of other processes' CPU time above which a host of ``cpus`` CPUs is busy
    (unknown count: taken as 2)."""
    return OTHERS_BUSY_SHARE * max(cpus or 2, 2)


def was_busy(load: float | None, cpus: int | None, others: float | None = None) -> bool:
    """The rule for every measured table: more runnable work (1-minute load average) than CPUs
    when it was measured, or other processes using more than :func:`others_limit` cores during
    the measurement itself (unknown: not busy)."""
    return (load is not None and cpus is not None and load > cpus) or (
        others is not None and others > others_limit(cpus)
    )


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU time counters at one instant: wall clock (s), every CPU's busy time (s, Linux's
    ``/proc/stat``; ``None`` elsewhere) and this process's own CPU time (s, all threads)."""

    wall: float
    host_busy: float | None
    own: float


def cpu_snapshot() -> CpuSnapshot:
    """The counters now (see :class:`CpuSnapshot`)."""
    host_busy: float | None = None
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        if fields and fields[0] == "cpu":
            # user nice system idle iowait irq softirq steal ...: busy is all but idle and
            # iowait; steal counts, since a hypervisor's other guests compete for the cores too.
            ticks = [int(x) for x in fields[1:9]]
            busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7]
            host_busy = busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        host_busy = None
    return CpuSnapshot(wall=time.perf_counter(), host_busy=host_busy, own=time.process_time())


def others_cores(start: CpuSnapshot, end: CpuSnapshot) -> float | None:
    """Cores' worth of CPU time that processes other than this one used between two snapshots
    (0.0: nothing else ran; 1.0: one other core busy all along); ``None`` where the host's
    counters are unknown or the window is under :data:`MIN_WINDOW_S` (the counters tick every
    10 ms: a shorter window cannot tell one other core from none)."""
    if start.host_busy is None or end.host_busy is None or end.wall - start.wall < MIN_WINDOW_S:
        return None
    others = (end.host_busy - start.host_busy) - (end.own - start.own)
    return round(max(0.0, others / (end.wall - start.wall)), 3)


def sample_others(seconds: float = 0.3) -> float | None:
    """Cores' worth of CPU time other processes use now, sampled over ``seconds`` while this
    process sleeps (``None`` where unknown)."""
    start = cpu_snapshot()
    time.sleep(seconds)
    return others_cores(start, cpu_snapshot())


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
        others: cores' worth of CPU time other processes used during the measurement
            (:func:`others_cores`; ``None``: not recorded, or a platform without the counters).
        prefix_len: the cached context (tokens) the forwards ran on.
    """

    key: Mapping[str, str] = field(default_factory=dict)
    measured_at: str = ""
    load: float | None = None
    cpus: int | None = None
    others: float | None = None
    prefix_len: int = 64

    @property
    def busy(self) -> bool:
        """Whether the host was busy when this was measured (:func:`was_busy`). Such a table
        describes contention, not the machine: on the 2-core CPU of docs/engine.md, one node
        cost 1.8x a plain step at load 6-8 and 0.97x at 2.6."""
        return was_busy(self.load, self.cpus, self.others)

    def describe_host(self) -> str:
        """How busy the host was, as logs and benchmarks print it."""
        load = "load not recorded" if self.load is None else f"load {self.load} on {self.cpus} CPUs"
        return load if self.others is None else f"{load}, other processes {self.others:.2f} cores"

    def to_dict(self) -> dict[str, Any]:
        """The table as stored (JSON-ready): its grid and :meth:`provenance`."""
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        """The provenance fields as stored in the table's JSON."""
        return {"key": dict(self.key), "measured_at": self.measured_at, "load": self.load, "cpus": self.cpus,
                "others": self.others, "prefix_len": self.prefix_len}

    @staticmethod
    def provenance_from(data: Mapping[str, Any]) -> dict[str, Any]:
        """The provenance keyword arguments read back from a table's JSON (absent: defaults)."""
        load, cpus, others = data.get("load"), data.get("cpus"), data.get("others")
        return {
            "key": dict(data.get("key", {})), "measured_at": str(data.get("measured_at", "")),
            "load": None if load is None else float(load), "cpus": None if cpus is None else int(cpus),
            "others": None if others is None else float(others), "prefix_len": int(data.get("prefix_len", 64)),
        }


def table_path(kind: str, key: Mapping[str, str], directory: Path, prefix_len: int = 64) -> Path:
    """``<directory>/<kind>-<model>-<dtype>-<device>-<machine>[-ctx<n>].json``."""
    slug = "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", key[k]) for k in ("model", "dtype", "device", "machine"))
    # The 64-token table keeps its original name (tables cached before contexts existed).
    ctx = "" if prefix_len == 64 else f"-ctx{prefix_len}"
    return directory / f"{kind}-{slug}{ctx}.json"


_WARNED: set[Path] = set()  # once per file and process: every drafter build reads the table
# A busy cached table: the host is checked once per file and process, and never for a table
# this process measured itself (measuring again at once would rarely find the host changed).
_RECHECKED: set[Path] = set()


def warn_if_busy(table: MeasuredTable, path: Path) -> None:
    if table.busy and path not in _WARNED:
        _WARNED.add(path)
        log.warning(
            "the measured table %s was measured while the host was busy (%s): it describes contention, "
            "not this machine, and the trees sized from it may speculate less (or more) than this machine "
            "pays for; it is measured again by the first process that finds the host quiet (or delete the file)",
            path, table.describe_host(),
        )


T = TypeVar("T", bound=MeasuredTable)


def load_or_measure(
    path: Path,
    parse: Callable[[Mapping[str, Any]], T],
    measure: Callable[[], T],
    key: Mapping[str, str] | None = None,
    *,
    probe: Callable[[], float | None] = sample_others,
) -> T:
    """The table cached at ``path``, else ``measure()`` saved there (a damaged file is
    measured again and overwritten).

    A table measured on a busy host (:attr:`MeasuredTable.busy`) is warned about once per
    process; when one that another process measured is read back, ``probe()`` (cores other
    processes use now, sampled for a fraction of a second; once per file and process) decides:
    a quiet host measures it again and overwrites it, a busy one keeps using it. So contention
    that corrupted a table once does not size every later run on a quiet machine (a cached
    busy table used to stay until someone deleted it).

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
            if stale:
                log.warning(
                    "the measured table %s holds for %s, not for this target (%s); measuring it again",
                    path, dict(table.key), dict(key or {}),
                )
            elif table.busy and path not in _RECHECKED:
                _RECHECKED.add(path)
                now = probe()
                if now is not None and now <= others_limit(os.cpu_count()):
                    log.warning(
                        "the measured table %s was measured while the host was busy (%s); the host is quiet now "
                        "(other processes %.2f cores): measuring it again", path, table.describe_host(), now,
                    )
                else:
                    warn_if_busy(table, path)
                    return table
            else:
                warn_if_busy(table, path)
                return table
    log.info("measuring %s once (cached in %s)", path.stem, path.parent)
    table = measure()
    _RECHECKED.add(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table.to_dict(), indent=1) + "\n", encoding="utf-8")
    warn_if_busy(table, path)
    return table
