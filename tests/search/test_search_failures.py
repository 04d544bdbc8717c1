"""Failures around a trial: a stalled worker, interrupts outside the evaluator, the window
between RUNNING and the first heartbeat, and configurations given up."""

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

from tss_opt.storage.optuna_adapter import study_storage, trial_id

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


SETTINGS = dict(mode="exhaustive", max_depth=2)


def _interrupt_when_writing(monkeypatch: pytest.MonkeyPatch, victim: frozenset[int]) -> None:
    """Ctrl-C while the victim's attributes are written (after its evaluator returned)."""
    original = optuna.Trial.set_user_attr

    def set_user_attr(self: optuna.Trial, key: str, value: object) -> None:
        skip = study_storage(self.study).get_trial(trial_id(self)).user_attrs.get("skip_set")
        if key == "feasible" and frozenset(skip or ()) == victim:
            raise KeyboardInterrupt
        original(self, key, value)

    monkeypatch.setattr(optuna.Trial, "set_user_attr", set_user_attr)


def test_interrupt_outside_the_evaluator_is_not_a_crash(
    tmp_path: Path, study_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Ctrl-C while a trial's attributes are written do not give its configuration up."""
    from tss_opt.search import run_search
    from tss_opt.search.study import FAIL_REASON_KEY

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    ref = reference_search(Landscape(L, SEED).measure, L, **SETTINGS)
    victim = frozenset({2})
    with monkeypatch.context() as m:
        _interrupt_when_writing(m, victim)
        for _ in range(2):
            with pytest.raises(KeyboardInterrupt):
                run_search(Landscape(L, SEED), storage=url, study_name=study_name,
                           show_progress=False, **SETTINGS)  # fmt: skip
    result = run_search(
        Landscape(L, SEED), storage=url, study_name=study_name, show_progress=False, **SETTINGS
    )
    assert result.given_up == []
    assert result.best == ref.best and set(result.pareto) == ref.pareto
    assert result.record(victim).accept_length is not None
    failed = [t for t in optuna.load_study(study_name=study_name, storage=url).get_trials()
              if t.state == TrialState.FAIL]  # fmt: skip
    assert len(failed) == 2
    assert all("KeyboardInterrupt" in t.system_attrs[FAIL_REASON_KEY] for t in failed)


def test_interrupt_while_taking_a_trial_is_not_a_crash(
    tmp_path: Path, study_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C between RUNNING and the first heartbeat: the trial is failed as interrupted."""
    import tss_opt.search.lifecycle as lifecycle
    from tss_opt.search import run_search
    from tss_opt.search.study import FAIL_REASON_KEY

    url = f"sqlite:///{tmp_path / 'tss.db'}"

    def record_heartbeat(storage: object, trial_id: int) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(lifecycle, "record_heartbeat", record_heartbeat)
        with pytest.raises(KeyboardInterrupt):
            run_search(Landscape(L, SEED), storage=url, study_name=study_name,
                       show_progress=False, **SETTINGS)  # fmt: skip
    (trial,) = optuna.load_study(study_name=study_name, storage=url).get_trials()
    assert trial.state == TrialState.FAIL
    assert "KeyboardInterrupt" in trial.system_attrs[FAIL_REASON_KEY]


def test_running_trial_without_heartbeat_goes_stale(storage_url: str, study_name: str) -> None:
    """A worker killed between "RUNNING" and its first heartbeat does not block the search."""
    from tss_opt.search import run_search
    from tss_opt.storage import fail_stale, open_storage

    ref = reference_search(Landscape(L, SEED).measure, L, mode="exhaustive", max_depth=1)
    with pytest.raises(KeyboardInterrupt):  # baseline done, level 1 queued
        run_search(Landscape(L, SEED, interrupt_after=2), storage=storage_url,
                   study_name=study_name, show_progress=False, mode="exhaustive", max_depth=1)  # fmt: skip
    storage = open_storage(storage_url, heartbeat_interval=1, grace_period=2)
    study = optuna.load_study(study_name=study_name, storage=storage)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    orphan = trial_id(waiting[0])
    # What a worker SIGKILLed right after taking the trial leaves: RUNNING, no heartbeat.
    assert storage.set_trial_state_values(orphan, TrialState.RUNNING)
    fail_stale(study)
    assert storage.get_trial(orphan).state == TrialState.RUNNING  # not before the grace
    time.sleep(3.5)
    fail_stale(study)
    assert storage.get_trial(orphan).state == TrialState.FAIL

    result = run_search(Landscape(L, SEED), storage=storage_url, study_name=study_name,
                        show_progress=False, mode="exhaustive", max_depth=1,
                        heartbeat_interval=1, grace_period=2)  # fmt: skip
    assert result.finished and result.best == ref.best


def test_given_up_configuration_is_reported(
    tmp_path: Path, study_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A configuration whose workers crashed twice is named in the result, log and CLI output."""
    from optuna.trial import create_trial

    from tss_opt.cli.search import format_result
    from tss_opt.search import run_search

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    with pytest.raises(KeyboardInterrupt):  # baseline done, level 1 queued
        run_search(Landscape(L, SEED, interrupt_after=2), storage=url, study_name=study_name,
                   show_progress=False, **SETTINGS)  # fmt: skip
    study = optuna.load_study(study_name=study_name, storage=url)
    victim = frozenset({2})
    # What two workers that died on {2} leave behind: two FAIL trials without a reason.
    crashes = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if t.user_attrs["skip_set"] == [2]:
            assert study_storage(study).set_trial_state_values(trial_id(t), TrialState.RUNNING)
            study_storage(study).set_trial_state_values(trial_id(t), TrialState.FAIL)
            crashes += 1
    for _ in range(2 - crashes):
        study.add_trial(
            create_trial(state=TrialState.FAIL, user_attrs={"skip_set": [2], "level": 1})
        )
    with caplog.at_level("INFO", logger="tss_opt.search"):
        result = run_search(
            Landscape(L, SEED), storage=url, study_name=study_name, **SETTINGS
        )
    assert result.given_up == [victim]
    assert result.summary()["given_up"] == [[2]]
    assert optuna.load_study(study_name=study_name, storage=url).user_attrs["result"][
        "given_up"
    ] == [[2]]
    final = [r.getMessage() for r in caplog.records if "search finished" in r.getMessage()]
    assert final and "GIVEN UP" in final[-1] and "[2]" in final[-1]
    assert "GIVEN UP" in format_result(result, 1.0) and "[2]" in format_result(result, 1.0)
