"""Unit tests of the pure Algorithm-1 functions: thresholds, ties, Pareto, plans."""

from __future__ import annotations

import pytest

from tss_opt.search import Measurement, SearchSettings, plan_search
from tss_opt.search.algorithm import candidate_pool, thresholds_for
from tss_opt.search.selection import pareto_front, select_min_cost, select_triple_win

F = frozenset


def M(a: float, m: float, c: float, tps: float | None = None) -> Measurement:
    return Measurement(accept_length=a, metric=m, cost=c, tokens_per_s=tps)


def test_relative_and_absolute_thresholds() -> None:
    base = M(4.0, 0.5, 1.0)
    rel = thresholds_for(base, SearchSettings(eps_accept=0.1, eps_metric=0.2))
    assert rel.accept == pytest.approx(3.6) and rel.metric == pytest.approx(0.4)
    ab = thresholds_for(base, SearchSettings(relative=False, eps_accept=0.5, eps_metric=0.1))
    assert ab.accept == pytest.approx(3.5) and ab.metric == pytest.approx(0.4)
    pool = thresholds_for(base, SearchSettings(tau_accept=0.25), pool=True)
    assert pool.accept == pytest.approx(3.0)
    lower = thresholds_for(M(4.0, 10.0, 1.0), SearchSettings(), metric_higher_is_better=False)
    assert lower.metric == pytest.approx(10.5)  # a lower-is-better metric may rise 5 %
    assert lower.satisfied(M(4.0, 10.4, 1.0)) and not lower.satisfied(M(4.0, 10.6, 1.0))
    neg = thresholds_for(M(4.0, -2.0, 1.0), SearchSettings())
    assert neg.metric == pytest.approx(-2.1)  # "5 % worse" stays below a negative baseline
    # Constraint values: [(A0 - eps_A) - A, (M0 - eps_M) - M].
    assert rel.constraints(M(3.0, 0.45, 1.0)) == pytest.approx((0.6, -0.05))


def test_pool_is_permissive_and_feasibility_strict() -> None:
    thr = thresholds_for(M(3.0, 0.5, 1.0), SearchSettings(), pool=True)
    singles = {
        0: M(3.0, 0.1, 1.0),  # acceptance ok only -> in the pool
        1: M(1.0, 0.5, 1.0),  # metric ok only -> in the pool
        2: M(1.0, 0.1, 1.0),  # neither -> out
        3: None,  # given up -> out
    }
    assert candidate_pool(singles, thr) == (0, 1)
    assert not thr.satisfied(singles[0]) and not thr.satisfied(singles[1])


def test_min_cost_tie_rules() -> None:
    r = {
        F(): M(3.0, 0.5, 1.0),
        F({1}): M(3.0, 0.5, 0.8),
        F({2}): M(3.1, 0.5, 0.8),  # same cost, higher acceptance wins
    }
    assert select_min_cost(r, r) == F({2})
    r[F({3})] = M(3.1, 0.6, 0.8)  # then better metric
    assert select_min_cost(r, r) == F({3})
    r[F({4, 5})] = M(3.1, 0.6, 0.8)  # then more layers skipped
    assert select_min_cost(r, r) == F({4, 5})
    r[F({0, 6})] = M(3.1, 0.6, 0.8)  # then the smaller sorted tuple
    assert select_min_cost(r, r) == F({0, 6})
    r[F({7})] = M(1.0, 0.0, 0.1)  # cheapest of all, but only feasible sets compete
    assert select_min_cost([c for c in r if c != F({7})], r) == F({0, 6})
    assert select_min_cost([F()], r) == F()  # the baseline may win: S* = empty set


def test_triple_win() -> None:
    base = M(3.0, 0.5, 1.0, tps=100.0)
    r = {
        F(): base,
        F({1}): M(3.5, 0.5, 0.9, tps=110.0),
        F({2}): M(3.5, 0.5, 0.9, tps=90.0),  # slower than dense: excluded
        F({3}): M(3.9, 0.49, 0.9, tps=130.0),  # metric below dense: excluded
        F({4, 5}): M(3.5, 0.55, 0.8, tps=105.0),  # ties on acceptance: larger |S| first
    }
    assert select_triple_win(r, r, base) == F({4, 5})
    r[F({6, 7})] = M(3.5, 0.55, 0.8, tps=120.0)  # same |S|: faster first
    assert select_triple_win(r, r, base) == F({6, 7})
    assert select_triple_win([F(), F({2}), F({3})], r, base) == F()  # nothing wins
    no_tps = M(3.0, 0.5, 1.0)
    assert select_triple_win([F({2})], r, no_tps) == F({2})  # no tokens/s: not checked


def test_pareto_front_keeps_equal_points_and_drops_dominated() -> None:
    r = {
        F(): M(3.0, 0.5, 1.0),
        F({1}): M(3.2, 0.5, 0.9),  # dominates the baseline
        F({2}): M(3.2, 0.5, 0.9),  # equal to {1}: both kept
        F({3}): M(3.0, 0.6, 0.95),  # better metric: kept
        F({4}): M(2.0, 0.4, 0.5),  # cheapest: kept
    }
    assert pareto_front(r, r) == [F({4}), F({1}), F({2}), F({3})]
    lower = {F(): M(3.0, 10.0, 1.0), F({1}): M(3.0, 9.0, 1.0)}
    assert pareto_front(lower, lower, metric_higher_is_better=False) == [F({1})]


def test_plan_walks_levels_and_reports_the_frontier() -> None:
    s = SearchSettings(max_depth=3, early_barrier=1, latter_barrier=1)
    plan = plan_search(s, 5, {})
    assert plan.frontier == (F(),) and not plan.finished
    results = {F(): M(3.0, 0.5, 1.0)}
    plan = plan_search(s, 5, results)
    assert plan.frontier == (F({1}), F({2}), F({3}))  # barriers: layers 1..3
    results.update({F({1}): M(3.0, 0.5, 0.9), F({2}): None, F({3}): M(1.0, 0.1, 0.9)})
    plan = plan_search(s, 5, results)
    # {2} was given up (crashed twice): evaluated, infeasible, not in the pool.
    assert plan.levels[1].evaluated == 3 and plan.levels[1].feasible == (F({1}),)
    assert plan.pool == (1,)
    assert plan.finished and plan.stop_reason.startswith("level 2 has no configuration")


def test_plan_stops_on_max_trials_and_baseline_failure() -> None:
    s = SearchSettings(max_trials=3)
    results = {F(): M(3.0, 0.5, 1.0), F({0}): M(3.0, 0.5, 0.9)}
    plan = plan_search(s, 4, results)
    assert plan.frontier == (F({1}),)  # the cap keeps a prefix of level 1
    results[F({1})] = M(3.0, 0.5, 0.9)
    plan = plan_search(s, 4, results)
    assert plan.finished and plan.stop_reason == "max_trials=3 reached (level 1: 2 of 4 evaluated)"
    failed = plan_search(SearchSettings(), 4, {F(): None})
    assert failed.finished and failed.baseline is None


def test_budget_cut_level_without_feasible_set_reports_the_budget() -> None:
    """A level cut short by max_trials is not a level 'without a feasible configuration'."""
    s = SearchSettings(max_trials=3)
    results = {F(): M(3.0, 0.5, 1.0), F({0}): M(1.0, 0.1, 0.9), F({1}): M(1.0, 0.1, 0.9)}
    plan = plan_search(s, 4, results)
    assert plan.finished and plan.stop_reason.startswith("max_trials=3 reached")
