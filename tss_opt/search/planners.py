"""Planners of the rival strategies: pure functions from stored results to a
:class:`~tss_opt.search.algorithm.SearchPlan` (see :mod:`tss_opt.search.strategies` for what
each strategy does). No Optuna or storage here; :mod:`tss_opt.search.registry` maps each mode
to its planner.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence

from tss_opt.config.objectives import ACCEPT_LENGTH
from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import (
    Config,
    LevelReplay,
    Measurement,
    SearchPlan,
    canonical,
    plan_search,
    restrict,
)

__all__ = [
    "plan_greedy",
    "plan_one_objective",
    "plan_random",
    "random_sequence",
]

def plan_one_objective(
    settings: SearchSettings,
    num_layers: int,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> SearchPlan:
    """``accept_only`` / ``metric_only``: Algorithm 1 in beam mode ranked on one objective."""
    return plan_search(
        settings, num_layers, results, metric_higher_is_better=metric_higher_is_better,
        objective=settings.mode_spec.objective,
    )


def _greedy_key(settings: SearchSettings, hib: bool):
    sign = 1.0 if hib else -1.0
    by_accept = settings.mode_spec.ranks_by_score and settings.sleb_score == ACCEPT_LENGTH

    def key(c: Config, m: Measurement) -> tuple:
        metric = sign * m.metric
        first, second = (m.accept_length, metric) if by_accept else (metric, m.accept_length)
        return (-first, -second, m.cost, canonical(c))

    return key


def plan_greedy(
    settings: SearchSettings,
    num_layers: int,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> SearchPlan:
    """Replay the greedy ``sleb`` / ``gm_skip`` search over ``results`` (see module doc)."""
    spec = settings.mode_spec
    allowed = settings.allowed_layers(num_layers)
    key = _greedy_key(settings, metric_higher_is_better)
    replay = LevelReplay(settings, results, metric_higher_is_better=metric_higher_is_better)
    current: Config = frozenset()
    for k in itertools.count():
        if k == 0:
            configs = [frozenset()]
        else:
            remaining = [i for i in allowed if i not in current]
            if not remaining:
                return replay.stop(f"every allowed layer skipped at step {k - 1}")
            configs = sorted((current | {i} for i in remaining), key=canonical)
        if (stop := replay.level(k, configs)) is not None:
            return stop
        thr = replay.thresholds
        assert thr is not None
        if (stop := replay.cut_short("step")) is not None:
            return stop
        if k >= 1:
            measured = [c for c in replay.levels[-1].configs if results[c] is not None]
            if not measured:
                return replay.stop(f"step {k}: every candidate failed")
            best = min(measured, key=lambda c: key(c, results[c]))  # type: ignore[arg-type]
            if spec.stops_on_metric and not restrict(thr, "metric").satisfied(results[best]):  # type: ignore[arg-type]
                return replay.stop(
                    f"step {k}: no candidate keeps the metric within eps_metric (best {list(canonical(best))})"
                )
            current = best
        if (stop := replay.limit(k)) is not None:
            return stop
    raise AssertionError("unreachable")


def random_sequence(
    allowed: Sequence[int], max_depth: int, count: int, seed: int
) -> list[Config]:
    """``count`` distinct random skip sets, sizes cycling 1..``max_depth``, from ``seed``.

    Sizes whose every subset has been drawn are skipped; fewer than ``count`` sets come back
    only when every subset of the allowed layers up to ``max_depth`` has been drawn.
    """
    rng = random.Random(seed)
    pool = list(allowed)
    depth = min(max_depth, len(pool))
    sizes = list(range(1, depth + 1))
    left = {k: math.comb(len(pool), k) for k in sizes}
    drawn: set[Config] = set()
    out: list[Config] = []
    while len(out) < count and any(left.values()):
        for k in sizes:
            if len(out) >= count:
                break
            if not left[k]:
                continue
            for _ in range(64):
                c = frozenset(rng.sample(pool, k))
                if c not in drawn:
                    break
            else:  # nearly exhausted: draw among what is left (few sets, cheap to list)
                rest = [frozenset(t) for t in itertools.combinations(pool, k) if frozenset(t) not in drawn]
                c = rng.choice(rest)
            drawn.add(c)
            left[k] -= 1
            out.append(c)
    return out


def plan_random(
    settings: SearchSettings,
    num_layers: int,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> SearchPlan:
    """The ``random`` strategy: the baseline, then ``max_trials - 1`` drawn skip sets."""
    assert settings.max_trials is not None, "check_budget refuses random without max_trials"
    allowed = settings.allowed_layers(num_layers)
    replay = LevelReplay(settings, results, metric_higher_is_better=metric_higher_is_better)
    if (stop := replay.level(0, [frozenset()])) is not None:
        return stop
    # All drawn at once: the budget left after the baseline is max_trials - 1, so no prefix is cut.
    configs = random_sequence(allowed, settings.max_depth, settings.max_trials - 1, settings.seed)
    if (stop := replay.level(1, configs)) is not None:
        return stop
    if len(configs) < settings.max_trials - 1:
        return replay.stop(f"every skip set of size <= {settings.max_depth} drawn")
    return replay.stop(f"max_trials={settings.max_trials} reached")
