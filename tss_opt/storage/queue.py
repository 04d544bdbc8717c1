"""A light query of a study's queue (WAITING trials) on RDB storages.

``storage.get_all_trials(states=(WAITING,))`` builds every waiting trial with its parameters
and attributes; taking one trial from a queue of n that way costs O(n), so a level of n
configurations costs O(n^2). Taking trials only needs their ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import select

from tss_opt.storage.locks import unwrap_storage

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

__all__ = ["waiting_trial_ids"]


def waiting_trial_ids(storage: BaseStorage, study_id: int, limit: int = 32) -> list[int]:
    """Ids of the oldest WAITING trials of a study (at most ``limit``).

    Falls back to ``get_all_trials`` for storages that are not RDB.
    """
    backend = unwrap_storage(storage)
    if not isinstance(backend, RDBStorage):
        trials = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,))
        return [t._trial_id for t in trials[:limit]]
    session = backend.scoped_session()
    try:
        query = (
            select(models.TrialModel.trial_id)
            .where(models.TrialModel.study_id == study_id)
            .where(models.TrialModel.state == TrialState.WAITING)
            .order_by(models.TrialModel.trial_id)
            .limit(limit)
        )
        ids = list(session.execute(query).scalars())
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
    return ids
