"""Choosing S* among the evaluated skip sets, and the Pareto set beside it.

- ``min_cost`` (the paper's rule): least cost, then higher acceptance, then better metric, then
  larger ``|S|``, then canonical order. The dense baseline competes (then S* is the empty set).
- ``triple_win``: among evaluated sets with metric and acceptance not worse than dense and
  tokens/s not lower than dense (checked only when the dense run reports tokens/s): higher
  acceptance, then larger ``|S|``, then higher tokens/s, then canonical order; the empty set
  when none qualifies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tss_opt.search.algorithm import Config, Measurement, SearchPlan, beam_rank_key, canonical

__all__ = ["pareto_front", "select", "select_min_cost", "select_triple_win"]


def _goodness(m: Measurement, metric_higher_is_better: bool) -> tuple[float, float, float]:
    # All three turned into "higher is better".
    return (m.accept_length, m.metric if metric_higher_is_better else -m.metric, -m.cost)


def pareto_front(
    configs: Iterable[Config],
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> list[Config]:
    """Configurations not dominated on (acceptance up, metric up, cost down).

    ``a`` dominates ``b`` when ``a`` is at least as good on all three and better on one.
    Returned by ascending cost, then canonical order.
    """
    items = [(c, _goodness(results[c], metric_higher_is_better)) for c in configs]
    front = []
    for c, g in items:
        dominated = any(
            all(x >= y for x, y in zip(h, g, strict=True))
            and any(x > y for x, y in zip(h, g, strict=True))
            for _, h in items
        )
        if not dominated:
            front.append(c)
    return sorted(front, key=lambda c: (results[c].cost, canonical(c)))


def select_min_cost(
    feasible: Iterable[Config],
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> Config:
    """The feasible configuration of least cost (ties: see the module docstring)."""
    sign = 1.0 if metric_higher_is_better else -1.0

    def key(c: Config) -> tuple:
        m = results[c]
        return (m.cost, -m.accept_length, -sign * m.metric, -len(c), canonical(c))

    candidates = list(feasible)
    return min(candidates, key=key) if candidates else frozenset()


def select_triple_win(
    evaluated: Iterable[Config],
    results: Mapping[Config, Measurement | None],
    baseline: Measurement,
    *,
    metric_higher_is_better: bool = True,
) -> Config:
    """Metric, acceptance and tokens/s all at least dense; ranked by acceptance, |S|, tokens/s."""

    def wins(m: Measurement) -> bool:
        metric_ok = (
            m.metric >= baseline.metric if metric_higher_is_better else m.metric <= baseline.metric
        )
        if baseline.tokens_per_s is None:
            speed_ok = True
        else:
            speed_ok = m.tokens_per_s is not None and m.tokens_per_s >= baseline.tokens_per_s
        return metric_ok and m.accept_length >= baseline.accept_length and speed_ok

    candidates = [c for c in evaluated if c and results.get(c) is not None and wins(results[c])]
    if not candidates:
        return frozenset()
    return min(candidates, key=lambda c: beam_rank_key(c, results[c]))


def select(
    selection: str,
    plan: SearchPlan,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> Config:
    """Apply the selection rule named ``selection`` to a plan's results."""
    if plan.baseline is None:
        return frozenset()
    if selection == "min_cost":
        return select_min_cost(
            plan.feasible, results, metric_higher_is_better=metric_higher_is_better
        )
    if selection == "triple_win":
        evaluated = [c for c in plan.planned if c in results]
        return select_triple_win(
            evaluated, results, plan.baseline, metric_higher_is_better=metric_higher_is_better
        )
    raise ValueError(f"Unknown selection {selection!r}; expected one of: min_cost, triple_win.")
