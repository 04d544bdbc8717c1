"""Optuna heartbeats: small helpers around ``optuna.storages`` that hide its experimental warnings.

Optuna fails a RUNNING trial whose heartbeat is older than the grace period only when some
worker calls ``fail_stale_trials`` (``Study.optimize`` does it before each new trial). Workers
that wait for a level to finish call :func:`fail_stale` themselves, so a killed worker's
trial is failed (and retried) even when no other worker is starting a trial.

Optuna only looks at trials that have a heartbeat. A trial is set RUNNING and gets its first
heartbeat in two transactions, so a worker killed in between leaves a RUNNING trial without
heartbeat that Optuna never fails and that blocks its level forever (issue 15).
:func:`fail_stale` also fails such a trial once it started more than the grace period ago.
"""

from __future__ import annotations

import copy
import warnings
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.trial import TrialState

from tss_opt.config.search import DEFAULT_GRACE_PERIOD, DEFAULT_HEARTBEAT_INTERVAL
from tss_opt.storage.locks import unwrap_storage

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "fail_stale",
    "heartbeat_enabled",
    "record_heartbeat",
]

# A trial of a killed worker is failed (and retried) 30 to 40 s after its last heartbeat.
# One heartbeat write every 10 s per running trial is negligible load on any backend.


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """Whether ``storage`` records heartbeats (an RDB storage with ``heartbeat_interval``)."""
    return is_heartbeat_enabled(unwrap_storage(storage))


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's trials whose heartbeat is stale and run the storage's stale callback."""
    if not heartbeat_enabled(study._storage):
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
    backend = unwrap_storage(study._storage)
    if not isinstance(backend, RDBStorage) or backend.heartbeat_interval is None:
        return
    grace = backend.grace_period or 2 * backend.heartbeat_interval
    for trial_id in _running_without_heartbeat(backend, study._study_id, grace):
        try:
            if not backend.set_trial_state_values(trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:
            continue  # another worker failed it first
        callback = backend.get_heartbeat_stale_trial_callback()
        if callback is not None:
            callback(study, copy.deepcopy(backend.get_trial(trial_id)))


def _running_without_heartbeat(storage: RDBStorage, study_id: int, grace_s: int) -> list[int]:
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    # Optuna writes datetime_start from the worker's clock (not the database's), stored as
    # naive UTC in the column behind the `datetime_start` property: compare the same way.
    cutoff = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=grace_s)
    with _create_scoped_session(storage.scoped_session) as session:
        rows = (
            session.query(models.TrialModel.trial_id)
            .filter(models.TrialModel.study_id == study_id)
            .filter(models.TrialModel.state == TrialState.RUNNING)
            .filter(~models.TrialModel.heartbeats.any())
            .filter(models.TrialModel._datetime_start_utc < cutoff)
            .all()
        )
    return [r[0] for r in rows]


def record_heartbeat(storage: BaseStorage, trial_id: int) -> None:
    """Record one heartbeat for ``trial_id`` now (no-op when heartbeats are off)."""
    backend = unwrap_storage(storage)
    if is_heartbeat_enabled(backend):
        assert isinstance(backend, BaseHeartbeat)
        backend.record_heartbeat(trial_id)
