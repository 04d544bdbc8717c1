"""Every use of Optuna's private API in tss_opt, in one module.

Everything else goes through Optuna's public API (``Study.get_trials``, ``Study.tell``,
``BaseStorage`` methods, ``RDBStorage.record_heartbeat`` / ``get_heartbeat_interval``,
``optuna.storages.fail_stale_trials``). What is left has no public equivalent, or its public
equivalent costs a database round trip per call in the worker's hot path:

- :func:`unwrap_storage`: the storage behind ``Study._storage``'s ``_CachedStorage`` wrapper
  (``_backend``): the study lock and the SQLite guards need the engine;
- :func:`study_storage`, :func:`study_id`: ``Study._storage`` and ``Study._study_id`` (the
  public ``storage.get_study_id_from_name`` costs a query);
- :func:`trial_id`: ``Trial._trial_id`` / ``FrozenTrial._trial_id`` (the public
  ``storage.get_trial_id_from_study_id_trial_number`` costs a query);
- :func:`open_trial`: ``optuna.Trial(study, trial_id)``, the handle ``Study.ask`` builds for a
  trial it popped; the worker pops queued trials itself (``ask`` would create a new trial when
  the queue is empty);
- :func:`running_without_heartbeat`: a query on Optuna's RDB tables (the heartbeat table has no
  public reader).

``tests/storage/test_optuna_adapter.py`` checks each of these against the installed Optuna
(attributes exist, signatures, behaviour), so an Optuna release that changes one fails there,
not silently in a search.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from optuna.storages import BaseStorage, RDBStorage

__all__ = [
    "OPTUNA_TESTED_VERSIONS",
    "open_trial",
    "running_without_heartbeat",
    "study_id",
    "study_storage",
    "trial_id",
    "unwrap_storage",
]

# Major versions this module was checked against (tests/storage/test_optuna_adapter.py).
OPTUNA_TESTED_VERSIONS = ("5.",)


def unwrap_storage(storage: BaseStorage) -> BaseStorage:
    """The storage behind Optuna's ``_CachedStorage`` wrapper (what ``study_storage`` returns);
    any other storage unchanged."""
    return getattr(storage, "_backend", storage)


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes through (Optuna's cached wrapper for RDB)."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """The study's id in its storage."""
    return study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage id of a trial (not its ``number``)."""
    return trial._trial_id


def open_trial(study: optuna.Study, trial_id: int) -> optuna.Trial:
    """The ``optuna.Trial`` handle of a RUNNING trial this process took (as ``Study.ask``
    returns it: suggestions honour its ``fixed_params``, writes go through the study)."""
    return optuna.Trial(study, trial_id)


def running_without_heartbeat(storage: RDBStorage, study_id: int, grace_s: float) -> list[int]:
    """Ids of the study's RUNNING trials that never recorded a heartbeat and started more
    than ``grace_s`` seconds ago (see :func:`tss_opt.storage.fail_stale`)."""
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
