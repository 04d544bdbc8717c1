"""The :class:`~tss_opt.search.SearchResult` of a rival strategy, from its stored results.

Unlike the breadth-first search, whose plan marks feasibility as it goes, a rival strategy
may search with another rule (one objective, none at all); its result therefore applies the
one feasibility rule (:func:`~tss_opt.search.strategies.feasibility_rule`) and the selection
to *every* evaluated skip set. Records are in evaluation order (trial number); levels
summarise the evaluated sets per size |S|.
"""

from __future__ import annotations

from collections.abc import Mapping

from optuna.trial import FrozenTrial

from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import Config, Measurement, canonical
from tss_opt.search.result import LevelSummary, SearchResult, TrialRecord
from tss_opt.search.selection import pareto_front, select_min_cost, select_triple_win
from tss_opt.search.strategies import feasibility_rule

__all__ = ["build_strategy_result"]


def build_strategy_result(
    results: Mapping[Config, Measurement | None],
    complete: Mapping[Config, FrozenTrial],
    settings: SearchSettings,
    *,
    num_layers: int,
    metric_higher_is_better: bool,
    study_name: str,
    metric_name: str,
    stop_reason: str,
    finished: bool,
    pool: tuple[int, ...] = (),
    selection: str | None = None,
) -> SearchResult:
    """Records, true feasibility, Pareto set and S* over every evaluated skip set."""
    hib = metric_higher_is_better
    selection = selection or settings.selection
    baseline_m = results.get(frozenset())
    rule = (
        feasibility_rule(baseline_m, settings, metric_higher_is_better=hib)
        if baseline_m is not None
        else None
    )
    feasible = [
        c for c, m in results.items() if rule is not None and m is not None and rule.satisfied(m)
    ]
    feasible_set = set(feasible)
    order = sorted(
        results, key=lambda c: (complete[c].number if c in complete else 10**12, canonical(c))
    )
    records: list[TrialRecord] = []
    for config in order:
        m = results[config]
        if m is None:
            records.append(TrialRecord.given_up(config))
            continue
        records.append(TrialRecord.measured(config, m, complete[config], feasible=config in feasible_set))
    baseline = next((r.values for r in records if not r.skip_set), {})
    if baseline_m is None:
        best: Config = frozenset()
    elif selection == "min_cost":
        best = select_min_cost(feasible, results, metric_higher_is_better=hib)
    elif selection == "triple_win":
        best = select_triple_win(list(results), results, baseline_m, metric_higher_is_better=hib)
    else:
        raise ValueError(f"Unknown selection {selection!r}; expected one of: min_cost, triple_win.")
    pareto = pareto_front(feasible, results, metric_higher_is_better=hib) if baseline_m else []
    sizes = sorted({len(c) for c in results})
    levels = [
        LevelSummary(
            k,
            sum(1 for c in results if len(c) == k),
            sum(1 for c in results if len(c) == k),
            sum(1 for c in feasible if len(c) == k),
        )
        for k in sizes
    ]
    return SearchResult(
        best=best,
        pareto=pareto,
        baseline=baseline,
        trials=records,
        levels=levels,
        study_name=study_name,
        pool=tuple(pool),
        selection=selection,
        stop_reason=stop_reason,
        finished=finished,
        metric_name=metric_name,
        num_layers=num_layers,
    )
