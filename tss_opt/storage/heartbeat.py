"""Optuna heartbeats: small helpers around ``optuna.storages`` that hide its experimental warnings.

Optuna fails a RUNNING trial whose heartbeat is older than the grace period only when some
worker calls ``fail_stale_trials`` (``Study.optimize`` does it before each new trial). Workers
that wait for a level to finish call :func:`fail_stale` themselves, so a killed worker's
trial is failed (and retried) even when no other worker is starting a trial.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

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


def record_heartbeat(storage: BaseStorage, trial_id: int) -> None:
    """Record one heartbeat for ``trial_id`` now (no-op when heartbeats are off)."""
    backend = unwrap_storage(storage)
    if is_heartbeat_enabled(backend):
        assert isinstance(backend, BaseHeartbeat)
        backend.record_heartbeat(trial_id)
