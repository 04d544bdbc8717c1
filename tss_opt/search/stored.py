"""A search's :class:`~tss_opt.search.SearchResult` from its stored state, for every strategy.

:func:`result_from_state` is what a queued search's workers return and :func:`load_result`
what an inspection (export, report, profile) reads; both ask the registry
(:mod:`tss_opt.search.registry`) which kind of result the mode gives.
"""

from __future__ import annotations

import optuna

from tss_opt.config.search import SearchSettings
from tss_opt.search.optuna_strategy import stored_results
from tss_opt.search.registry import strategy_for
from tss_opt.search.result import SearchResult, build_result
from tss_opt.search.sampler import BreadthFirstSampler, StoredState
from tss_opt.search.strategy_result import build_strategy_result

__all__ = ["load_result", "result_from_state"]


def result_from_state(
    state: StoredState,
    sampler: BreadthFirstSampler,
    *,
    study_name: str,
    metric_name: str,
    selection: str | None = None,
) -> SearchResult:
    """The result of a queued strategy's stored state: Algorithm 1's keeps its plan's
    feasibility and levels; a rival's judges every evaluated set by the one rule."""
    settings = sampler.settings
    selection = str(selection or settings.selection)
    if strategy_for(settings.mode).breadth_first:
        return build_result(
            state, sampler, study_name=study_name, selection=selection, metric_name=metric_name
        )
    return build_strategy_result(
        state.results,
        state.complete,
        settings,
        num_layers=sampler.num_layers,
        metric_higher_is_better=sampler.metric_higher_is_better,
        study_name=study_name,
        metric_name=metric_name,
        stop_reason=state.plan.stop_reason,
        finished=state.plan.finished,
        pool=tuple(state.plan.pool or ()),
        selection=selection,
    )


def load_result(
    storage: str | optuna.storages.BaseStorage | None,
    study_name: str,
    *,
    selection: str | None = None,
) -> SearchResult:
    """Rebuild the result of a stored search without an evaluator.

    Args:
        storage: A URL (``None``: the default SQLite file) or an Optuna storage.
        study_name: The study.
        selection: Override the stored selection rule.

    Raises:
        KeyError: No such study.
        ValueError: The study was not created by :func:`~tss_opt.search.run_search`.
    """
    from tss_opt.storage import open_storage

    if storage is None or isinstance(storage, str):
        storage = open_storage(storage, heartbeat_interval=None, grace_period=None)
    study = optuna.load_study(study_name=study_name, storage=storage)
    attrs = study.user_attrs
    if "search_settings" not in attrs:
        raise ValueError(
            f"Study '{study_name}' was not created by tss_opt.search.run_search "
            "(it has no 'search_settings' user attribute)."
        )
    settings = SearchSettings.from_mapping(attrs["search_settings"])
    num_layers = int(attrs["num_layers"])
    hib = bool(attrs.get("metric_higher_is_better", True))
    metric_name = str(attrs.get("metric_name", "metric"))
    if not strategy_for(settings.mode).queued:
        # Optuna's samplers keep no plan: the results are the trials', and why the search
        # stopped is what its run stored.
        results, complete = stored_results(study.get_trials(deepcopy=False))
        stored = attrs.get("result") or {}
        return build_strategy_result(
            results, complete, settings, num_layers=num_layers, metric_higher_is_better=hib,
            study_name=study_name, metric_name=metric_name,
            stop_reason=str(stored.get("stop_reason", "")), finished=bool(stored.get("finished")),
            selection=selection,
        )  # fmt: skip
    sampler = BreadthFirstSampler(settings, num_layers, metric_higher_is_better=hib)
    return result_from_state(
        sampler.state(study), sampler, study_name=study_name, metric_name=metric_name,
        selection=selection,
    )  # fmt: skip
