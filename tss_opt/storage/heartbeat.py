"""Optuna heartbeats: small helpers around ``optuna.storages`` that hide its experimental warnings.

Optuna fails a RUNNING trial whose heartbeat is older than the grace period only when some
worker calls ``fail_stale_trials`` (``Study.optimize`` does it before each new trial). Workers
that wait for a level to finish call :func:`fail_stale` themselves, so a killed worker's
trial is failed (and retried) even when no other worker is starting a trial.

Optuna only looks at trials that have a heartbeat. A trial is set RUNNING and gets its first
heartbeat in two transactions, so a worker killed in between leaves a RUNNING trial without
heartbeat that Optuna never fails and that blocks its level forever.
:func:`fail_stale` also fails such a trial once it started more than the grace period ago.
"""

from __future__ import annotations

import copy
import threading
import warnings
from types import TracebackType
from typing import TYPE_CHECKING

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from tss_opt.config.search import DEFAULT_GRACE_PERIOD, DEFAULT_HEARTBEAT_INTERVAL
from tss_opt.storage.optuna_adapter import (
    running_without_heartbeat,
    study_id,
    study_storage,
    unwrap_storage,
)

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "Heartbeat",
    "fail_stale",
    "heartbeat_enabled",
    "record_heartbeat",
]

# A trial of a killed worker is failed (and retried) 30 to 40 s after its last heartbeat.
# One heartbeat write every 10 s per running trial is negligible load on any backend.


def _heartbeat_backend(storage: BaseStorage) -> RDBStorage | None:
    backend = unwrap_storage(storage)
    if isinstance(backend, RDBStorage) and backend.get_heartbeat_interval() is not None:
        return backend
    return None


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """Whether ``storage`` records heartbeats (an RDB storage with ``heartbeat_interval``)."""
    return _heartbeat_backend(storage) is not None


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's trials whose heartbeat is stale and run the storage's stale callback."""
    if not heartbeat_enabled(study_storage(study)):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
        _fail_running_without_heartbeat(study)


def _fail_running_without_heartbeat(study: optuna.Study) -> None:
    """Fail RUNNING trials that never got a heartbeat and started over the grace period ago.

    Same steps as ``optuna.storages.fail_stale_trials``: the state change succeeds in one
    worker only (the others get ``UpdateFinishedTrialError``), which then runs the callback.
    """
    backend = _heartbeat_backend(study_storage(study))
    if backend is None:
        return
    interval = backend.get_heartbeat_interval()
    assert interval is not None
    grace = backend.grace_period or 2 * interval
    for tid in running_without_heartbeat(backend, study_id(study), grace):
        try:
            if not backend.set_trial_state_values(tid, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:
            continue  # another worker failed it first
        callback = backend.get_heartbeat_stale_trial_callback()
        if callback is not None:
            callback(study, copy.deepcopy(backend.get_trial(tid)))


def record_heartbeat(storage: BaseStorage, trial_id: int) -> None:
    """Record one heartbeat for ``trial_id`` now (no-op when heartbeats are off)."""
    backend = _heartbeat_backend(storage)
    if backend is not None:
        backend.record_heartbeat(trial_id)


class Heartbeat:
    """Record a trial's heartbeat every ``heartbeat_interval`` seconds while the block runs.

    The thread Optuna's ``Study.optimize`` runs, for workers that drive their trials
    themselves (:mod:`tss_opt.search.lifecycle`). Unlike Optuna's, the thread is a daemon and
    leaving the block does not wait for it: a Ctrl-C that lands while the block ends can
    neither leave the process waiting for the thread at exit nor be delayed by a heartbeat
    that waits on a busy database. The thread stops after its current heartbeat.
    """

    def __init__(self, storage: BaseStorage, trial_id: int) -> None:
        self._rdb = _heartbeat_backend(storage)
        self._tid = trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self._rdb is not None:
            self._thread = threading.Thread(
                target=self._beat, name=f"tss-heartbeat-{self._tid}", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()

    def _beat(self) -> None:
        backend = self._rdb
        assert backend is not None
        interval = backend.get_heartbeat_interval()
        assert interval is not None
        while not self._stop.is_set():
            try:
                backend.record_heartbeat(self._tid)
            except Exception:  # noqa: BLE001 - a missed beat only makes the trial go stale
                pass
            if self._stop.wait(timeout=interval):
                return
