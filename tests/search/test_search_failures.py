"""Failures around a trial: a stalled worker, interrupts outside the evaluator, the window
between RUNNING and the first heartbeat, and configurations given up (issue 15)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from search_landscape import Landscape, read_log
from search_procs import evaluations, outputs, spawn_workers, stderr_of, wait_all
from search_reference import reference_search

L, SEED = 8, 0


def _wait_for_level1_start(workdir: Path, n: int, timeout: float = 60.0) -> tuple[int, frozenset[int]]:
    """The first worker (index) that starts a level-1 evaluation, and its skip set."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i in range(n):
            log = workdir / f"worker{i}.log"
            if log.exists():
                for what, skip in read_log(log):
                    if what == "start" and skip:
                        return i, skip
        time.sleep(0.02)
    raise AssertionError(f"no level-1 evaluation started in {workdir}")


@pytest.mark.slow
def test_stalled_worker_discards_its_late_result(tmp_path: Path, study_name: str) -> None:
    """SIGSTOP a worker mid-trial past the grace period, then SIGCONT: it carries on.

    Its trial is failed as stale by the other worker and re-run there; the stalled worker's
    late result is discarded (docs/search.md) instead of ending it with
    ``ValueError: Cannot tell a FAIL trial``.
    """
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    ref = reference_search(Landscape(L, SEED).measure, L, mode="exhaustive", max_depth=1)
    procs = spawn_workers(
        2, url, study_name, tmp_path,
        "--sleep", "0.5", "--heartbeat", "1", "--grace", "3", "--max-depth", "1",
    )  # fmt: skip
    try:
        stalled, victim = _wait_for_level1_start(tmp_path, 2)
        os.kill(procs[stalled].pid, signal.SIGSTOP)
        time.sleep(8)
        os.kill(procs[stalled].pid, signal.SIGCONT)
    finally:
        for p in procs:  # never leave a stopped process behind
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
    codes = wait_all(procs, tmp_path, timeout=120)
    assert codes == [0, 0], stderr_of(tmp_path)
    assert "discard" in (tmp_path / f"worker{stalled}.stderr").read_text()

    started, done = evaluations(tmp_path)
    assert set(done) == set(ref.evaluated)
    assert started[victim] == 2  # stalled once, re-run once
    for out in outputs(tmp_path):
        assert out["best"] == sorted(ref.best)
    trials = optuna.load_study(study_name=study_name, storage=url).get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [frozenset(t.user_attrs["skip_set"]) for t in failed] == [victim]
    assert failed[0].values is None  # the late result was not written over the FAIL
