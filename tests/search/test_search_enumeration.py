"""The engine enumerates exactly what an independent brute-force Algorithm 1 enumerates."""

from __future__ import annotations

import itertools

import optuna
import pytest
from search_landscape import Landscape
from search_reference import reference_search

from tss_opt.search import run_search

L = 8

CASES = {
    # name: settings (anything not given takes run_search's default)
    "exhaustive": dict(mode="exhaustive", max_depth=5),
    "exhaustive-triple": dict(mode="exhaustive", max_depth=5, selection="triple_win"),
    "beam3": dict(mode="beam", beam_width=3, max_depth=6),
    "beam2-triple": dict(mode="beam", beam_width=2, max_depth=6, selection="triple_win"),
    "barriers": dict(mode="exhaustive", early_barrier=2, latter_barrier=1),
    "beam-barriers": dict(mode="beam", beam_width=2, early_barrier=1, latter_barrier=2),
    "max-trials-in-level1": dict(mode="exhaustive", max_trials=5),
    "max-trials-in-level2": dict(mode="exhaustive", max_trials=14),
    "max-trials-beam": dict(mode="beam", beam_width=3, max_trials=20),
    "max-trials-1": dict(mode="exhaustive", max_trials=1),
    "absolute": dict(
        mode="exhaustive",
        relative=False,
        eps_accept=0.15,
        eps_metric=0.03,
        tau_accept=0.1,
        tau_metric=0.02,
    ),
    "absolute-beam": dict(
        mode="beam",
        relative=False,
        eps_accept=0.2,
        eps_metric=0.04,
        tau_accept=0.05,
        tau_metric=0.0,
    ),
    "loose-eps-tight-tau": dict(mode="exhaustive", eps_accept=0.12, tau_accept=0.0, tau_metric=0.0),
    "max-depth-2": dict(mode="exhaustive", max_depth=2),
    # No single skip keeps both objectives: the search must stop after level 1.
    "no-feasible-single": dict(mode="exhaustive", eps_accept=0.0, eps_metric=0.0),
    "depth-1-beam": dict(mode="beam", max_depth=1),
}
SEEDS = [0, 3, 7]


def _margin_ok(land: Landscape, settings: dict) -> bool:
    """No configuration lies within 1e-9 of a threshold (so float rounding cannot matter)."""
    base = land.measure(frozenset())
    rel = settings.get("relative", True)
    bounds = []
    for key, tol_keys in (
        ("accept_length", ("eps_accept", "tau_accept")),
        ("metric", ("eps_metric", "tau_metric")),
    ):
        for t in tol_keys:
            tol = settings.get(t, 0.05)
            b = base[key]
            bounds.append((key, b * (1 - tol) if rel else b - tol))
        bounds.append((key, base[key]))
    for k in range(1, L + 1):
        for s in itertools.combinations(range(L), k):
            m = land.measure(frozenset(s))
            for key, bound in bounds:
                if abs(m[key] - bound) < 1e-9:
                    return False
    return True


def _run(land: Landscape, settings: dict, name: str):
    return run_search(
        land,
        storage=optuna.storages.InMemoryStorage(),
        study_name=name,
        show_progress=False,
        **settings,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_matches_bruteforce_reference(case: str, seed: int) -> None:
    settings = CASES[case]
    land = Landscape(L, seed)
    assert _margin_ok(land, settings)
    ref = reference_search(land.measure, L, **settings)
    result = _run(land, settings, f"{case}-{seed}")

    # The exact set of evaluated skip sets, each evaluated once.
    assert result.evaluated == set(ref.evaluated)
    assert sorted(land.seen, key=lambda s: (len(s), sorted(s))) == sorted(
        ref.evaluated, key=lambda s: (len(s), sorted(s))
    )
    assert len(land.seen) == len(set(land.seen))
    # Levels are evaluated in order: every level-k evaluation precedes every level-(k+1) one.
    sizes = [len(s) for s in land.seen]
    assert sizes == sorted(sizes)
    assert [(lv.level, lv.evaluated, lv.feasible) for lv in result.levels] == ref.levels
    assert result.pool == ref.pool
    assert set(result.pareto) == ref.pareto
    assert result.best == ref.best
    assert result.finished
    assert {r.skip_set for r in result.trials if r.feasible} == set(ref.feasible)
    for r in result.trials:
        expected = land.measure(r.skip_set)
        assert r.accept_length == expected["accept_length"]
        assert r.metric == expected["metric"]
        assert r.cost == expected["cost"]
        assert r.values["metric_extras"] == expected["metric_extras"]
    assert result.baseline["accept_length"] == 3.0


@pytest.mark.parametrize("selection", ["min_cost", "triple_win"])
@pytest.mark.parametrize("mode", ["exhaustive", "beam"])
def test_lower_is_better_metric(mode: str, selection: str) -> None:
    land = Landscape(L, 5, metric_higher_is_better=False)
    settings = dict(mode=mode, selection=selection, max_depth=4)
    assert _margin_ok(land, settings)
    ref = reference_search(land.measure, L, higher_is_better=False, **settings)
    result = _run(land, settings, f"lower-{mode}-{selection}")
    assert result.evaluated == set(ref.evaluated)
    assert result.pool == ref.pool
    assert set(result.pareto) == ref.pareto
    assert result.best == ref.best


def test_cases_exercise_the_interesting_paths() -> None:
    """The landscapes are not trivial: the assertions above could fail in many ways."""
    ref = reference_search(Landscape(L, 0).measure, L, **CASES["exhaustive"])
    assert 0 < len(ref.pool) < L  # the pool filters
    assert len(ref.levels) >= 4  # several levels are reached
    assert any(f < e for _, e, f in ref.levels[1:])  # some sets are infeasible
    assert ref.best and len(ref.best) >= 2  # S* is a combination, not a single layer
    beam = reference_search(Landscape(L, 0).measure, L, **CASES["beam3"])
    assert set(beam.evaluated) != set(ref.evaluated)  # beam prunes differently
    trip = reference_search(Landscape(L, 3).measure, L, **CASES["exhaustive-triple"])
    mc = reference_search(Landscape(L, 3).measure, L, **CASES["exhaustive"])
    assert trip.best != mc.best  # the two selections disagree somewhere
    stop = reference_search(Landscape(L, 0).measure, L, **CASES["no-feasible-single"])
    assert stop.levels[-1] == (1, L, 0) and len(stop.pool) >= 2
    cut = reference_search(Landscape(L, 0).measure, L, **CASES["max-trials-in-level2"])
    assert len(cut.evaluated) == 14
    # Non-additivity: the pair effects make A({i,j}) differ from the additive prediction.
    land = Landscape(L, 0)
    a0 = land.measure(frozenset())["accept_length"]
    gaps = [
        land.measure(frozenset(p))["accept_length"]
        - (
            land.measure(frozenset([p[0]]))["accept_length"]
            + land.measure(frozenset([p[1]]))["accept_length"]
            - a0
        )
        for p in itertools.combinations(range(L), 2)
    ]
    assert max(abs(g) for g in gaps) > 0.1
