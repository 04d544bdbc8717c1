"""``run_search``: run (or join, or resume) the breadth-first TSS search of one study."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RDBStorage

from tss_opt.config.search import SearchSettings
from tss_opt.errors import TSSError
from tss_opt.search.contract import Evaluator, describe_evaluator
from tss_opt.search.interrupts import InterruptGuard
from tss_opt.search.note import save_search_note
from tss_opt.search.optuna_strategy import run_optuna_strategy
from tss_opt.search.progress import Progress
from tss_opt.search.registry import check_budget, strategy_for
from tss_opt.search.result import SearchResult
from tss_opt.search.sampler import MAX_CRASH_RETRIES, BreadthFirstSampler
from tss_opt.search.stored import result_from_state
from tss_opt.search.study import create_or_load_study
from tss_opt.search.worker import RetryStaleSkipSetCallback, Worker
from tss_opt.storage import (
    make_sqlite_safe,
    open_storage,
    unwrap_storage,
)

__all__ = ["SearchError", "run_search"]

logger = logging.getLogger("tss_opt.search")


class SearchError(TSSError):
    """The search cannot proceed (e.g. the dense baseline cannot be evaluated)."""


def run_search(
    evaluator: Evaluator,
    settings: SearchSettings | None = None,
    *,
    storage: str | BaseStorage | None,
    study_name: str,
    metadata: Mapping[str, Any] | None = None,
    show_progress: bool = True,
    **setting_values: Any,
) -> SearchResult:
    """Run Algorithm 1 of TSS as Optuna trials, cooperating with other workers.

    Every process that calls this with the same storage and study name joins the same
    search: each configuration is evaluated once, level k starts only when level k-1 is
    complete, a worker that dies mid-trial has its trial re-run once elsewhere, and every
    worker returns the same result when the search is finished. Calling it again on a
    stored study resumes it without re-evaluating completed trials; a stored study made with
    other identity settings or another protocol (``metadata["protocol"]``) is refused with the
    differences listed (:mod:`tss_opt.search.identity`).

    Settings come as a :class:`SearchSettings`, as keywords named after its fields (the
    documented form: ``run_search(ev, storage=..., study_name=..., mode="beam",
    beam_width=3)``), or both (keywords override fields of ``settings``).

    Args:
        evaluator: Measures a skip set (see :class:`tss_opt.search.Evaluator`).
        settings: The search settings; ``None``: defaults plus ``setting_values``.
        storage: A storage URL (``None``: ``sqlite:///storage/tss.db``) or an Optuna storage.
            Several processes need an RDB URL (SQLite file, PostgreSQL, MySQL).
        study_name: The study; see :func:`tss_opt.search.study_name_for`.
        metadata: Model id, num_layers, drafter, domain, split, protocol... stored in the
            study's user attributes and copied into the mapping by
            :func:`tss_opt.mapping.export_mapping`.
            ``mode`` picks the strategy: ``exhaustive`` / ``beam`` (Algorithm 1) or a rival
            (``sleb``, ``gm_skip``, ``random``, ``accept_only``, ``metric_only``, ``tpe``,
            ``nsga2``, ``gp``; see :mod:`tss_opt.search.strategies`), with ``seed`` and
            ``sleb_score`` for those that use them.
        show_progress: Log progress at INFO (else DEBUG) on logger ``tss_opt.search``.
        **setting_values: :class:`SearchSettings` fields (``mode``, ``beam_width``,
            ``max_depth``, ``eps_accept``, ``eps_metric``, ``tau_accept``, ``tau_metric``,
            ``relative``, ``early_barrier``, ``latter_barrier``, ``selection``,
            ``max_trials``, ``feasibility``, ``confidence``, ``max_repetition_increase``,
            ``early_stopping``, ``early_stop_chunk``, ``heartbeat_interval``,
            ``grace_period``).

    Returns:
        The :class:`SearchResult`.

    Raises:
        ValueError: Invalid or unknown settings (e.g. ``confidence`` outside (0.5, 1)), or
            an invalid evaluator.
        tss_opt.search.StudyMismatchError: The stored study has other settings or protocol.
        tss_opt.storage.StorageError: The storage URL is unparsable or unreachable.
        SearchError: The dense baseline could not be evaluated.
        tss_opt.search.EvaluatorError: A malformed answer, e.g. a ``per_prompt`` whose
            length differs from the dense run's.
        Exception: Whatever the evaluator raised (the trial is failed and re-queued).
    """
    settings = _settings(settings, setting_values)
    info = describe_evaluator(evaluator)
    settings.validate(info.num_layers)
    check_budget(settings, info.num_layers)
    strategy = strategy_for(settings.mode)
    if not isinstance(study_name, str) or not study_name:
        raise ValueError(f"study_name={study_name!r} must be a non-empty string.")
    guard = InterruptGuard()
    progress = Progress(info.metric_name, show=show_progress)
    with guard.held(), _storage_for(storage, settings) as store, _closing(progress):
        create_or_load_study(store, study_name, info, settings, metadata)
        if not strategy.queued:
            logger.log(
                progress.level, "worker runs study '%s' (%s sampler, L=%d, max_trials=%s)",
                study_name, settings.mode, info.num_layers, settings.max_trials,
            )
            result = run_optuna_strategy(
                store, study_name, settings, evaluator, info, progress, guard=guard
            )
            _finish(store, study_name, result, progress)
            return result
        sampler = BreadthFirstSampler(
            settings, info.num_layers, metric_higher_is_better=info.metric_higher_is_better
        )
        study = optuna.load_study(study_name=study_name, storage=store, sampler=sampler)
        logger.log(
            progress.level,
            "worker joins study '%s' (%s mode, L=%d)",
            study_name,
            settings.mode,
            info.num_layers,
        )
        state = Worker(study, evaluator, info, progress, guard).run()
        if state.plan.baseline is None:
            raise SearchError(
                f"Study '{study_name}': the dense baseline (empty skip set) could not be "
                f"evaluated ({state.plan.stop_reason}); its worker crashed "
                f"{MAX_CRASH_RETRIES + 1} times. Fix the evaluator, then delete the study or "
                "use a new study_name."
            )
        result = result_from_state(
            state, sampler, study_name=study_name, metric_name=info.metric_name
        )
        study.set_user_attr("result", result.summary())
        save_search_note(study, result)
        progress.finished(
            result.stop_reason, result.best, result.pareto, len(result.trials), result.given_up
        )
        return result


def _settings(settings: SearchSettings | None, values: Mapping[str, Any]) -> SearchSettings:
    if settings is not None and not isinstance(settings, SearchSettings):
        raise TypeError(
            f"settings={settings!r} is a {type(settings).__name__}; expected a SearchSettings "
            "(or pass the settings as keywords)."
        )
    base = settings.to_dict() if settings is not None else {}
    return SearchSettings.from_mapping({**base, **values})


def _finish(store: BaseStorage, study_name: str, result: SearchResult, progress: Progress) -> None:
    optuna.load_study(study_name=study_name, storage=store).set_user_attr("result", result.summary())
    if result.baseline == {}:
        raise SearchError(f"Study '{study_name}': the dense baseline could not be evaluated.")
    save_search_note(optuna.load_study(study_name=study_name, storage=store), result)
    progress.finished(
        result.stop_reason, result.best, result.pareto, len(result.trials), result.given_up
    )


@contextlib.contextmanager
def _closing(progress: Progress) -> Iterator[None]:
    """Close the worker's bars however the search ends (Ctrl-C, an evaluator's error)."""
    try:
        yield
    finally:
        progress.close()


@contextlib.contextmanager
def _storage_for(storage: str | BaseStorage | None, settings: SearchSettings) -> Iterator[BaseStorage]:
    with warnings.catch_warnings():
        # Optuna marks the retry callback experimental; the warning says nothing actionable.
        warnings.simplefilter("ignore", ExperimentalWarning)
        callback = RetryStaleSkipSetCallback(max_retry=MAX_CRASH_RETRIES)
    if storage is None or isinstance(storage, str):
        yield open_storage(
            storage,
            heartbeat_interval=settings.heartbeat_interval,
            grace_period=settings.grace_period,
            heartbeat_stale_trial_callback=callback,
        )
        return
    backend = unwrap_storage(storage)
    if not isinstance(backend, RDBStorage):
        yield storage
        return
    make_sqlite_safe(backend.engine)
    if backend.heartbeat_interval is None:
        logger.warning(
            "the storage records no heartbeats: a trial of a killed worker stays RUNNING and "
            "blocks its level; open it with tss_opt.storage.open_storage(url) instead"
        )
    previous = backend.heartbeat_stale_trial_callback
    if previous is not None and not isinstance(previous, RetryStaleSkipSetCallback):
        raise ValueError(
            f"The storage's heartbeat_stale_trial_callback is {type(previous).__name__}; its "
            "unlocked re-queueing can race with the search's own queue and evaluate a "
            "configuration twice. Open the storage without a callback (run_search installs "
            "RetryStaleSkipSetCallback) or pass the URL instead."
        )
    backend.heartbeat_stale_trial_callback = callback
    try:
        yield storage
    finally:
        backend.heartbeat_stale_trial_callback = previous
