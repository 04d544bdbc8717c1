"""Measured tables and a busy host (decoding/sizing/measured.py): the CPU time other processes
use during a measurement is recorded and seen, a table measured busy is warned about, kept
while the host stays busy and measured again once a later process finds it quiet."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tss_opt.decoding.sizing import LatencyTable, load_or_measure_latency
from tss_opt.decoding.sizing.measured import (
    CpuSnapshot,
    cpu_snapshot,
    load_or_measure,
    others_cores,
    others_limit,
    sample_others,
    was_busy,
)
from tss_opt.decoding.target import TargetModel
from tss_opt.models import LoadedModel

HAS_PROC_STAT = Path("/proc/stat").is_file()


@pytest.fixture
def target64(tiny64: LoadedModel) -> TargetModel:
    return TargetModel(tiny64.model)


def test_the_busy_rule() -> None:
    assert not was_busy(None, None, None)  # nothing recorded: not called busy
    assert others_limit(2) == 0.5 and others_limit(None) == 0.5 and others_limit(64) == 16.0
    assert not was_busy(1.9, 2, 0.3) and not was_busy(1.9, 2, 0.5)
    assert not was_busy(3.0, 64, 1.0)  # one other process on a host of 64 CPUs: not busy
    assert was_busy(7.5, 2, None)  # the load rule alone still holds for tables without ``others``
    # One other process on a core of a 2-core host, load 1.1: the load rule misses it, the
    # window's CPU time does not.
    assert not was_busy(1.1, 2) and was_busy(1.1, 2, 1.0)
    table = LatencyTable(seconds={0: 0.04, 1: 0.08}, load=1.1, cpus=2, others=0.97)
    assert table.busy and table.describe_host() == "load 1.1 on 2 CPUs, other processes 0.97 cores"
    assert LatencyTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table  # stored and read back
    assert LatencyTable(seconds={0: 0.04}).describe_host() == "load not recorded"


def test_others_cores_by_hand() -> None:
    # 2 s of wall time, the host's CPUs busy for 3.2 s of which this process used 1.2 s: the
    # others used 2.0 s, one core's worth.
    start, end = CpuSnapshot(wall=10.0, host_busy=100.0, own=5.0), CpuSnapshot(wall=12.0, host_busy=103.2, own=6.2)
    assert others_cores(start, end) == pytest.approx(1.0)
    assert others_cores(start, CpuSnapshot(wall=10.05, host_busy=100.0, own=5.0)) is None  # too short to tell
    assert others_cores(CpuSnapshot(wall=10.0, host_busy=None, own=5.0), end) is None  # no counters


@pytest.mark.skipif(not HAS_PROC_STAT, reason="the host's CPU counters come from Linux's /proc/stat")
def test_another_process_on_a_core_is_seen() -> None:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the interpreter started and spinning
        seen = sample_others(0.6)
    finally:
        burner.kill()
        burner.wait()
    # One spinning process is one core's worth (less only where it shares a core with more).
    assert seen is not None and seen > 0.5


@pytest.mark.skipif(not HAS_PROC_STAT, reason="the host's CPU counters come from Linux's /proc/stat")
def test_this_process_own_work_is_not_counted_as_others() -> None:
    start = cpu_snapshot()
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline:  # this process spins: its own time, not the others'
        pass
    end = cpu_snapshot()
    wall = end.wall - start.wall
    own = (end.own - start.own) / wall
    assert own > 0.25  # it got a good share of a core even where CI runs two suites side by side
    # The host's counters saw the spin too (its busy time includes this process's), and none of
    # it is counted among the others.
    host = (end.host_busy - start.host_busy) / wall
    others = others_cores(start, end)
    assert host >= own - 0.1 and others is not None and others <= host - own + 0.1


def _busy_copy(target64: TargetModel, tmp_path: Path) -> tuple[Path, LatencyTable]:
    """A real measured table rewritten as if measured busy, under the name a load looks for in a
    folder this process has not read."""
    measured = load_or_measure_latency(target64, tmp_path / "measured", sizes=(0, 1))
    busy = LatencyTable(seconds={0: 0.123, 1: 0.456}, key=measured.key, measured_at="2026-01-01T00:00:00+00:00",
                        load=1.1, cpus=2, others=1.02)
    path = tmp_path / "busy" / next((tmp_path / "measured").glob("latency-*.json")).name
    path.parent.mkdir()
    path.write_text(json.dumps(busy.to_dict()))
    return path, busy


def _counting(value: float | None) -> tuple[Callable[[], float | None], list[int]]:
    calls: list[int] = []

    def probe() -> float | None:
        calls.append(1)
        return value

    return probe, calls


def test_a_busy_table_is_kept_while_the_host_stays_busy_and_warned_once(
    target64: TargetModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, busy = _busy_copy(target64, tmp_path)
    probe, calls = _counting(1.4)
    measured: list[int] = []

    def measure() -> LatencyTable:
        measured.append(1)
        raise AssertionError("a busy table on a host that is still busy is not measured again")

    with caplog.at_level("WARNING", logger="tss_opt.decoding.sizing.measured"):
        first = load_or_measure(path, LatencyTable.from_dict, measure, busy.key, probe=probe)
        again = load_or_measure(path, LatencyTable.from_dict, measure, busy.key, probe=probe)
    assert first == again == busy and not measured
    assert len(calls) == 1  # the host is checked once per file and process
    warnings = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(warnings) == 1  # once per file and process, not per drafter build
    assert "host was busy (load 1.1 on 2 CPUs, other processes 1.02 cores)" in warnings[0]
    assert "measured again by the first process that finds the host quiet" in warnings[0]


def test_a_busy_table_is_measured_again_once_the_host_is_quiet(
    target64: TargetModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, busy = _busy_copy(target64, tmp_path)
    probe, calls = _counting(0.02)
    with caplog.at_level("WARNING", logger="tss_opt.decoding.sizing.measured"):
        fresh = load_or_measure(path, LatencyTable.from_dict, lambda: _measure(target64), busy.key, probe=probe)
    assert fresh.seconds != busy.seconds and fresh.measured_at != busy.measured_at
    assert json.loads(path.read_text())["seconds"] == {str(n): s for n, s in fresh.seconds.items()}  # overwritten
    assert len(calls) == 1
    assert any("the host is quiet now (other processes 0.02 cores): measuring it again" in r.getMessage()
               for r in caplog.records)
    # Read back in this process: the table it measured itself is not checked again.
    assert load_or_measure(path, LatencyTable.from_dict, lambda: _measure(target64), busy.key, probe=probe) == fresh
    assert len(calls) == 1


def test_a_table_this_process_measured_busy_is_not_checked_again(target64: TargetModel, tmp_path: Path) -> None:
    path = tmp_path / "latency-own.json"
    probe, calls = _counting(0.0)
    contended = LatencyTable(seconds={0: 0.05, 1: 0.09}, key={"model": "m"}, load=0.4, cpus=2, others=1.1)
    assert load_or_measure(path, LatencyTable.from_dict, lambda: contended, {"model": "m"}, probe=probe) == contended
    assert json.loads(path.read_text())["others"] == 1.1  # recorded in the cached file
    assert load_or_measure(path, LatencyTable.from_dict, lambda: contended, {"model": "m"}, probe=probe) == contended
    assert not calls  # measuring again at once would rarely find the host changed


def _measure(target64: TargetModel) -> LatencyTable:
    from tss_opt.decoding.sizing.latency import hardware_key, measure_latency

    return measure_latency(target64, (0, 1), key=hardware_key(target64))
