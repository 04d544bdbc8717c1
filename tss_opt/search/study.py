"""The Optuna study of one search: naming, creation, the settings check, attribute keys.

A study stores, as user attributes (shown by optuna-dashboard): ``search_settings``,
``metadata``, ``num_layers``, ``metric_name``, ``metric_higher_is_better`` and, once the search
is finished, ``result`` (the selected set and the Pareto set). Its objectives are
``["accept_length", <metric_name>, "cost"]`` (maximize, maximize or minimize, minimize).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from tss_opt.search.algorithm import Config
from tss_opt.search.evaluator import EvaluatorInfo, to_json
from tss_opt.search.settings import SearchSettings, settings_hash
from tss_opt.storage import storage_url, study_lock

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
# Metadata keys that identify what a study measures; a resume must not change them.
IDENTITY_METADATA = ("model", "num_layers", "drafter", "domain", "split")


class StudyMismatchError(ValueError):
    """An existing study was created with different settings, model or objectives."""


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


def _slug(value: Any) -> str:
    text = str(value).strip().rstrip("/").split("/")[-1].lower()
    text = re.sub(r"[^a-z0-9]+", "_", text).strip("_")
    return text or "x"


def study_name_for(
    *,
    domain: str,
    model: str,
    drafter: str,
    split: str = "calibration",
    settings: SearchSettings | Mapping[str, Any] | None = None,
) -> str:
    """A stable, readable study name: ``<domain>.<model>.<drafter>.<split>.s<hash>``.

    The model id keeps only its last path part (``HuggingFaceTB/SmolLM2-135M-Instruct`` ->
    ``smollm2_135m_instruct``); the hash covers the settings that decide which configurations
    are evaluated (not ``selection``), so changing them gives a new study.

    Example:
        ``study_name_for(domain="qa", model="smollm2-135m", drafter="pld",
        split="calibration")`` -> ``"qa.smollm2_135m.pld.calibration.s<7 hex digits>"``.
    """
    parts = [_slug(domain), _slug(model), _slug(drafter), _slug(split)]
    return ".".join(parts) + ".s" + settings_hash(settings)


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
        if "search_settings" not in attrs:
            if study._storage.get_all_trials(study._study_id, deepcopy=False):
                raise StudyMismatchError(
                    f"Study '{study_name}' in {storage_url(storage)} already has trials but was "
                    "not created by tss_opt.search; choose another study_name."
                )
            _check_directions(study, directions, study_name, storage)
            study.set_user_attr("search_settings", settings.to_dict())
            study.set_user_attr("metadata", meta)
            study.set_user_attr("num_layers", info.num_layers)
            study.set_user_attr("metric_name", info.metric_name)
            study.set_user_attr("metric_higher_is_better", info.metric_higher_is_better)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # set_metric_names
                study.set_metric_names(["accept_length", info.metric_name, "cost"])
            study._storage.set_study_system_attr(study._study_id, FORMAT_KEY, FORMAT_VERSION)
            return study
        _check_directions(study, directions, study_name, storage)
        _check_same_search(study, study_name, storage, info, settings, meta)
        stored = dict(attrs["search_settings"])
        if stored != settings.to_dict():
            # Only non-identity fields differ (selection, heartbeats): keep the latest.
            study.set_user_attr("search_settings", settings.to_dict())
        return study


def _how_to_fix(study_name: str, storage: BaseStorage) -> str:
    return (
        "To keep the stored study, re-run with its settings. To start a new search, pass "
        "another study_name (tss_opt.search.study_name_for(...) derives one from the settings) "
        f"or delete this one: optuna delete-study --study-name {study_name} "
        f"--storage {storage_url(storage)}"
    )


def _check_directions(
    study: optuna.Study,
    directions: list[StudyDirection],
    study_name: str,
    storage: BaseStorage,
) -> None:
    # create_study(load_if_exists=True) silently keeps the stored directions.
    if list(study.directions) != directions:
        stored = [d.name.lower() for d in study.directions]
        wanted = [d.name.lower() for d in directions]
        raise StudyMismatchError(
            f"Study '{study_name}' has directions {stored}, but this search needs {wanted} "
            "(accept_length, metric, cost). " + _how_to_fix(study_name, storage)
        )


def _check_same_search(
    study: optuna.Study,
    study_name: str,
    storage: BaseStorage,
    info: EvaluatorInfo,
    settings: SearchSettings,
    meta: Mapping[str, Any],
) -> None:
    attrs = study.user_attrs
    diffs: list[str] = []
    stored = attrs.get("search_settings", {})
    for name in settings.identity():
        if name in stored and stored[name] != getattr(settings, name):
            diffs.append(f"{name}: stored {stored[name]!r}, requested {getattr(settings, name)!r}")
    for key, value in (
        ("num_layers", info.num_layers),
        ("metric_name", info.metric_name),
        ("metric_higher_is_better", info.metric_higher_is_better),
    ):
        if attrs.get(key) != value:
            diffs.append(f"{key}: stored {attrs.get(key)!r}, requested {value!r}")
    stored_meta = attrs.get("metadata", {})
    for key in IDENTITY_METADATA:
        if key in stored_meta and key in meta and stored_meta[key] != meta[key]:
            diffs.append(f"metadata.{key}: stored {stored_meta[key]!r}, requested {meta[key]!r}")
    if diffs:
        raise StudyMismatchError(
            f"Study '{study_name}' in {storage_url(storage)} was created with different "
            f"settings: {'; '.join(diffs)}. " + _how_to_fix(study_name, storage)
        )


def running_or_waiting(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials not finished yet."""
    return [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
