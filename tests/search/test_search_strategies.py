"""Rival strategies on synthetic landscapes with known answers."""

from __future__ import annotations

import itertools
import math

import optuna
import pytest
from search_landscape import Landscape

from tss_opt.config.search import SettingTypeError
from tss_opt.search import MODES, SearchSettings, load_result, run_search
from tss_opt.search.strategies import random_sequence

L = 6
QUICK = [m for m in MODES if m != "gp"]


def _run(land, name="s", **kw):
    kw.setdefault("show_progress", False)
    storage = kw.pop("storage", None) or optuna.storages.InMemoryStorage()
    return run_search(land, storage=storage, study_name=name, **kw), storage


def _bounds(land, eps=0.05):
    base = land.measure(frozenset())
    return base["accept_length"] * (1 - eps), base["metric"] * (1 - eps)


def _truly_feasible(land, s, eps=0.05):
    a, m = _bounds(land, eps)
    v = land.measure(frozenset(s))
    return v["accept_length"] >= a and v["metric"] >= m


def _greedy_reference(land, score, depth, stop_on_metric=False):
    """SLEB / GM-Skip by hand: evaluated sets and the path."""
    allowed = range(land.num_layers)
    _, m_bound = _bounds(land)
    current: frozenset[int] = frozenset()
    evaluated = {frozenset()}
    for _ in range(depth):
        cands = [current | {i} for i in allowed if i not in current]
        if not cands:
            break
        evaluated.update(cands)

        def key(c):
            v = land.measure(c)
            first, second = (v["accept_length"], v["metric"]) if score == "accept_length" else (v["metric"], v["accept_length"])
            return (-first, -second, v["cost"], tuple(sorted(c)))

        best = min(cands, key=key)
        if stop_on_metric and land.measure(best)["metric"] < m_bound:
            break
        current = best
    return evaluated, current


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("score", ["metric", "accept_length"])
def test_sleb_picks_what_greedy_must_pick(seed, score):
    land = Landscape(L, seed)
    r, _ = _run(land, mode="sleb", sleb_score=score, max_depth=4)
    evaluated, _ = _greedy_reference(land, score, 4)
    assert r.evaluated == evaluated
    assert len(land.seen) == len(evaluated)  # each set once
    assert r.finished and "max_depth=4" in r.stop_reason


def test_gm_skip_stops_when_the_metric_bound_breaks():
    for seed in range(12):
        land = Landscape(L, seed)
        evaluated, _ = _greedy_reference(land, "metric", L, stop_on_metric=True)
        if len(evaluated) < 1 + sum(L - k for k in range(L)):  # it stops early somewhere
            break
    r, _ = _run(land, mode="gm_skip", max_depth=L)
    assert r.evaluated == evaluated
    assert "no candidate keeps the metric" in r.stop_reason


def test_random_is_reproducible_from_its_seed():
    a, _ = _run(Landscape(8, 0), mode="random", max_trials=20, seed=5, max_depth=3)
    b, _ = _run(Landscape(8, 0), mode="random", max_trials=20, seed=5, max_depth=3)
    c, _ = _run(Landscape(8, 0), mode="random", max_trials=20, seed=6, max_depth=3)
    assert a.evaluated == b.evaluated and a.best == b.best
    assert a.evaluated != c.evaluated
    assert len(a.evaluated) == 20 and max(len(s) for s in a.evaluated) == 3
    seq = random_sequence(range(8), 3, 19, 5)
    assert [len(s) for s in seq[:6]] == [1, 2, 3, 1, 2, 3]
    assert set(seq) | {frozenset()} == a.evaluated
    # Small spaces are exhausted, not looped on.
    assert len(random_sequence(range(3), 2, 100, 0)) == 3 + 3


@pytest.mark.parametrize("mode", QUICK)
def test_every_strategy_stays_within_max_trials(mode):
    land = Landscape(8, 1)
    r, storage = _run(land, mode=mode, max_trials=12, seed=0)
    assert land.calls <= 12 and len(r.trials) <= 12
    assert r.finished
    # Trials have the breadth-first shape: params, user attrs, objectives, constraints.
    study = optuna.load_study(study_name="s", storage=storage)
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        assert set(t.params) == {f"skip_{i}" for i in range(8)}
        assert {"accept_length", "f1"} <= set(t.constraints)
        if "duplicate_of" in t.user_attrs:
            continue
        assert {"skip_set", "level", "num_skipped", "sparsity", "feasible", "tokens_per_s"} <= set(t.user_attrs)
        assert sorted(i for i, v in enumerate(t.params[f"skip_{i}"] for i in range(8)) if v) == t.user_attrs["skip_set"]
    again = load_result(storage, "s")
    assert again.best == r.best and again.evaluated == r.evaluated


@pytest.mark.parametrize("mode", ["tpe", "nsga2", pytest.param("gp", marks=pytest.mark.slow)])
def test_optuna_samplers_respect_constraints_and_barriers(mode):
    land = Landscape(8, 2)
    r, storage = _run(land, mode=mode, max_trials=14, seed=1, early_barrier=1, latter_barrier=1)
    assert _truly_feasible(land, r.best)
    assert r.best_record.feasible
    assert all(0 not in s and 7 not in s for s in r.evaluated)  # barriers held
    assert frozenset() in r.evaluated and r.trials[0].skip_set == frozenset()  # baseline first
    assert len(r.evaluated) <= 14


def test_no_strategy_beats_the_exhaustive_answer_among_truly_feasible_sets():
    land = Landscape(L, 0)
    every = [frozenset(s) for k in range(L + 1) for s in itertools.combinations(range(L), k)]
    optimum = min(land.measure(s)["cost"] for s in every if _truly_feasible(land, s))
    ex, _ = _run(Landscape(L, 0), mode="exhaustive", max_depth=L, name="ex")
    assert land.measure(ex.best)["cost"] == optimum  # breadth-first search finds it here
    for mode in QUICK:
        r, _ = _run(Landscape(L, 0), mode=mode, max_trials=30, seed=0, max_depth=L, name=mode)
        assert _truly_feasible(land, r.best), mode
        assert land.measure(r.best)["cost"] >= optimum - 1e-12, mode


@pytest.mark.parametrize("mode,objective", [("accept_only", 0), ("metric_only", 1)])
def test_one_objective_searches_pool_on_that_objective(mode, objective):
    land = Landscape(8, 0)
    r, _ = _run(land, mode=mode, max_depth=3)
    bound = _bounds(land)[objective]
    key = ("accept_length", "metric")[objective]
    expected = tuple(i for i in range(8) if land.measure(frozenset({i}))[key] >= bound)
    assert r.pool == expected
    # The final selection still uses both objectives.
    assert _truly_feasible(land, r.best)
    for t in r.trials:
        if t.feasible:
            assert _truly_feasible(land, t.skip_set)


def test_resume_of_a_greedy_search_evaluates_nothing_twice():
    storage = optuna.storages.InMemoryStorage()
    with pytest.raises(KeyboardInterrupt):
        _run(Landscape(L, 0, interrupt_after=9), mode="sleb", max_depth=3, storage=storage)
    land = Landscape(L, 0)
    r, _ = _run(land, mode="sleb", max_depth=3, storage=storage)
    full, _ = _run(Landscape(L, 0), mode="sleb", max_depth=3, name="full")
    assert r.evaluated == full.evaluated and r.best == full.best
    assert len(land.seen) == len(full.evaluated) - 8  # the 8 completed before the interrupt


def test_bad_inputs_say_what_to_do():
    land = Landscape(8, 0)
    with pytest.raises(ValueError) as e:
        _run(land, mode="greedy")
    for m in MODES:
        assert m in str(e.value)
    with pytest.raises(ValueError, match=r"mode='sleb': its first level needs 9 evaluations"):
        _run(land, mode="sleb", max_trials=5)
    with pytest.raises(ValueError, match=r"needs 7 evaluations"):
        _run(land, mode="accept_only", max_trials=6, early_barrier=1, latter_barrier=1)
    with pytest.raises(ValueError, match=r"mode='random' needs a budget"):
        _run(land, mode="random")
    with pytest.raises(ValueError, match=r"max_trials=1 is too small for mode='tpe'.*needs 2"):
        _run(land, mode="tpe", max_trials=1)
    with pytest.raises(SettingTypeError, match="seed='abc' has type str; expected an integer"):
        _run(land, mode="random", max_trials=5, seed="abc")
    with pytest.raises(TypeError, match="has type float"):
        SearchSettings(seed=1.5)
    assert land.calls == 0


def test_negative_tolerance_requires_a_gain():
    s = SearchSettings(eps_accept=-0.05, tau_accept=-0.05)
    from tss_opt.search.algorithm import Measurement, thresholds_for

    thr = thresholds_for(Measurement(2.0, 0.5, 1.0), s)
    assert math.isclose(thr.accept, 2.1)
    with pytest.raises(ValueError, match="-1 < eps_accept < 0 to require a gain"):
        SearchSettings(eps_accept=-1.0)


def test_a_resumed_optuna_search_keeps_the_paired_rule():
    """Optuna-sampler trials store per_prompt like breadth-first ones: a resumed search rebuilds
    the paired rule from the stored dense trial, so every trial has the same constraints (GP
    refuses a study whose trials differ) and feasibility does not change on resume."""
    from search_noisy import NoisyLandscape

    class Interrupting(NoisyLandscape):
        def __call__(self, skip, prompt_ids=None):
            if self.calls >= 4:
                raise KeyboardInterrupt
            return super().__call__(skip, prompt_ids)

    effects = [(0.0, 0.0, 0.1)] * 6
    storage = optuna.storages.InMemoryStorage()
    kw = dict(mode="tpe", max_trials=8, seed=0, feasibility="paired", early_barrier=0, latter_barrier=0)
    with pytest.raises(KeyboardInterrupt):
        _run(Interrupting(effects), storage=storage, **kw)
    _run(NoisyLandscape(effects), storage=storage, **kw)
    trials = [t for t in optuna.load_study(study_name="s", storage=storage).trials if t.state.name == "COMPLETE"]
    dense = next(t for t in trials if t.user_attrs.get("skip_set") == [])
    assert "per_prompt" in dense.user_attrs
    assert {len(t.system_attrs["constraints"]) for t in trials} == {3}  # paired: A, metric, repetition


def test_each_mode_declares_what_differs_once():
    """The registry of modes is the ``Mode`` members' specs: exact expectations per mode, and
    what the identity, the planners and the samplers read follows from them."""
    from tss_opt.config.search import Mode
    from tss_opt.search.registry import PLANNERS, STRATEGIES, strategy_for

    assert set(STRATEGIES) == set(MODES) == {m.value for m in Mode}
    assert {m for m in MODES if Mode(m).spec.seeded} == {"random", "tpe", "nsga2", "gp"}
    assert {m for m in MODES if not Mode(m).spec.queued} == {"tpe", "nsga2", "gp"}
    assert {m for m in MODES if Mode(m).spec.breadth_first} == {"exhaustive", "beam"}
    assert {m for m in MODES if Mode(m).spec.plan == "greedy"} == {"sleb", "gm_skip"}
    assert {m: Mode(m).spec.objective for m in MODES if Mode(m).spec.objective != "both"} == {
        "accept_only": "accept", "metric_only": "metric",
    }
    assert [m for m in MODES if Mode(m).spec.every_subset] == ["exhaustive"]
    assert [m for m in MODES if Mode(m).spec.stops_on_metric] == ["gm_skip"]
    assert [m for m in MODES if Mode(m).spec.ranks_by_score] == ["sleb"]
    for m in MODES:
        s = strategy_for(m)
        assert (s.planner is None) != (s.sampler is None)
        assert s.planner is None or s.planner is PLANNERS[s.spec.plan]
        # The identity carries seed exactly for the seeded modes, sleb_score exactly for sleb.
        identity = SearchSettings(mode=m, seed=3).identity()
        assert ("seed" in identity) == s.spec.seeded and ("sleb_score" in identity) == (m == "sleb")
    sampler = strategy_for("nsga2").sampler(1, 40)
    assert type(sampler).__name__ == "NSGAIISampler"
