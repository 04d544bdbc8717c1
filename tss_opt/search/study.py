"""The Optuna study of one search: creation (with the identity check), attribute keys.

A study stores, as user attributes (shown by optuna-dashboard): ``search_settings``,
``metadata``, ``num_layers``, ``metric_name``, ``metric_higher_is_better`` and, once the search
is finished, ``result`` (the selected set and the Pareto set). Its objectives are
:data:`~tss_opt.config.objectives.OBJECTIVE_NAMES` with the metric's slot named by the task
metric (``[accept_length, <metric_name>, cost]``; maximize, maximize or minimize, minimize).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from tss_opt.config.objectives import ACCEPT_LENGTH, COST
from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import Config
from tss_opt.search.contract import EvaluatorInfo, to_json
from tss_opt.search.identity import (
    IDENTITY_METADATA,
    StudyMismatchError,
    check_directions,
    check_same_search,
    study_name_for,
)
from tss_opt.storage import storage_url, study_lock
from tss_opt.storage.optuna_adapter import study_id

__all__ = [
    "FAIL_REASON_KEY",
    "IDENTITY_METADATA",
    "StudyMismatchError",
    "config_of",
    "create_or_load_study",
    "directions_for",
    "param_name",
    "study_lock_key",
    "study_name_for",
]

FORMAT_KEY = "tss_opt:format"
FORMAT_VERSION = 1
# Written on a trial whose evaluation raised (error or Ctrl-C): such a trial was not
# crashed by its worker's death, so it does not use up the crash retry.
FAIL_REASON_KEY = "tss_opt:fail_reason"


def param_name(layer: int) -> str:
    """The Optuna parameter of one layer: ``skip_<layer>`` (True: skipped)."""
    return f"skip_{layer}"


def study_lock_key(study_name: str) -> str:
    """The name of the cross-process lock guarding one study's queue."""
    return f"tss_opt:study:{study_name}"


def directions_for(metric_higher_is_better: bool) -> list[StudyDirection]:
    """Accept length up, metric per its direction, cost down."""
    return [
        StudyDirection.MAXIMIZE,
        StudyDirection.MAXIMIZE if metric_higher_is_better else StudyDirection.MINIMIZE,
        StudyDirection.MINIMIZE,
    ]


def config_of(trial: FrozenTrial) -> Config | None:
    """The skip set a trial evaluates (``None`` for a trial this package did not create)."""
    skip = trial.user_attrs.get("skip_set")
    if isinstance(skip, list) and all(isinstance(x, int) for x in skip):
        return frozenset(skip)
    return None


def create_or_load_study(
    storage: BaseStorage,
    study_name: str,
    info: EvaluatorInfo,
    settings: SearchSettings,
    metadata: Mapping[str, Any] | None,
) -> optuna.Study:
    """Create the study, or load it after checking that it is the same search.

    Runs under the study's cross-process lock, so concurrent workers agree on one creator.

    Raises:
        StudyMismatchError: The stored study differs in directions, metric, layer count,
            identity settings or identity metadata; the message lists each difference and
            how to start a new study instead.
    """
    directions = directions_for(info.metric_higher_is_better)
    meta = {str(k): to_json(v) for k, v in (metadata or {}).items()}
    meta.setdefault("num_layers", info.num_layers)
    with study_lock(storage, study_lock_key(study_name)):
        study = optuna.create_study(
            storage=storage, study_name=study_name, directions=directions, load_if_exists=True
        )
        attrs = study.user_attrs
        if not _made(storage, study, attrs):
            if "search_settings" not in attrs and study.get_trials(deepcopy=False):
                raise StudyMismatchError(
                    f"Study '{study_name}' in {storage_url(storage)} already has trials but was "
                    "not created by tss_opt.search; choose another study_name."
                )
            # A new study, or one whose creator was stopped before it finished writing the
            # identity (Ctrl-C, kill): no trial can exist yet (trials are queued only after
            # this returns), so the identity is (re)written whole.
            check_directions(study, directions, study_name, storage)
            study.set_user_attr("search_settings", settings.to_dict())
            study.set_user_attr("metadata", meta)
            study.set_user_attr("num_layers", info.num_layers)
            study.set_user_attr("metric_name", info.metric_name)
            study.set_user_attr("metric_higher_is_better", info.metric_higher_is_better)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # set_metric_names
                study.set_metric_names([ACCEPT_LENGTH, info.metric_name, COST])
            # Written last: its presence says the identity above is complete.
            storage.set_study_system_attr(study_id(study), FORMAT_KEY, FORMAT_VERSION)
            return study
        check_directions(study, directions, study_name, storage)
        check_same_search(study, study_name, storage, info, settings, meta)
        stored = dict(attrs["search_settings"])
        if stored != settings.to_dict():
            # Only non-identity fields differ (selection, heartbeats): keep the latest.
            study.set_user_attr("search_settings", settings.to_dict())
        return study


# The user attributes create_or_load_study writes before FORMAT_KEY.
_IDENTITY_ATTRS = ("search_settings", "metadata", "num_layers", "metric_name", "metric_higher_is_better")


def _made(storage: BaseStorage, study: optuna.Study, attrs: Mapping[str, Any]) -> bool:
    """Whether the study's identity was written completely.

    Optuna cannot create a study together with its attributes, so creation is several
    writes; the format marker is the last one (a Ctrl-C in between used to leave studies that
    every resume refused with "num_layers: stored None"). Studies made before the marker
    count as made when every identity attribute is there.
    """
    if FORMAT_KEY in storage.get_study_system_attrs(study_id(study)):
        return True
    return all(k in attrs for k in _IDENTITY_ATTRS)
