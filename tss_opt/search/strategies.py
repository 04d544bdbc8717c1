"""Rival search strategies on the TSS study space (the paper's Table 2 comparison).

Every strategy searches the same space (one boolean ``skip_<i>`` per layer, barriers
respected), with the same evaluator, feasibility rule (:func:`feasibility_rule`, the rule of
:mod:`tss_opt.search.algorithm`), budget (``max_trials`` evaluated skip sets, the dense
baseline included) and final selection (``selection`` over every evaluated set), and writes
trials of the same shape as the breadth-first search.

Deterministic strategies are *planners*: pure functions from the stored results to a
:class:`~tss_opt.search.algorithm.SearchPlan`, run by :class:`StrategySampler` through the
same queue and workers as :class:`~tss_opt.search.BreadthFirstSampler` (so several workers
and resume work unchanged). A "level" of a plan is one step of the strategy:

- ``sleb``: step k evaluates ``S_{k-1} + {l}`` for every allowed layer ``l`` not in
  ``S_{k-1}``; ``S_k`` is the candidate with the best quality score (``sleb_score``: the task
  metric on the calibration prompts by default, or the accepted length; ties: the other
  objective, then lower cost, then the sorted tuple). Like SLEB, it removes layers until
  ``max_depth`` (or the budget) whatever their feasibility.
- ``gm_skip``: the same greedy steps ranked by the task metric, stopping at the first step
  whose best candidate breaks the metric bound (GM-Skip's tolerance stop).
- ``random``: skip sets drawn uniformly, sizes cycling 1, 2, ..., ``max_depth``, no set twice,
  from ``random.Random(seed)``; all drawn at once after the baseline (one step).
- ``accept_only`` / ``metric_only``: :func:`~tss_opt.search.algorithm.plan_search` in beam
  mode with the pool, the search-time feasibility and the beam ranking on one objective.

``tpe``, ``nsga2`` and ``gp`` run Optuna's samplers (:mod:`tss_opt.search.optuna_strategy`).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence

from tss_opt.config.search import BFS_MODES, MODES, OPTUNA_MODES, SearchSettings
from tss_opt.search.algorithm import (
    Config,
    Feasibility,
    LevelReplay,
    Measurement,
    SearchPlan,
    canonical,
    feasibility_for,
    plan_search,
    restrict,
)
from tss_opt.search.sampler import MAX_CRASH_RETRIES, BreadthFirstSampler

__all__ = [
    "GREEDY_MODES",
    "ONE_OBJECTIVE_MODES",
    "QUEUED_MODES",
    "StrategySampler",
    "check_budget",
    "feasibility_rule",
    "first_level_size",
    "plan_greedy",
    "plan_random",
    "plan_strategy",
    "random_sequence",
]

GREEDY_MODES = ("sleb", "gm_skip")
ONE_OBJECTIVE_MODES = {"accept_only": "accept", "metric_only": "metric"}
# Strategies run by the shared queue and workers (several workers may join).
QUEUED_MODES = tuple(m for m in MODES if m not in OPTUNA_MODES)


def feasibility_rule(
    baseline: Measurement, settings: SearchSettings, *, metric_higher_is_better: bool = True
) -> Feasibility:
    """The feasibility rule every strategy's final selection uses: the search's own
    (:func:`~tss_opt.search.algorithm.feasibility_for`: paired when ``feasibility: paired``
    and the evaluator gives per-prompt values, else the point rule), so a rival strategy is
    judged exactly as the breadth-first search and the worker judge its trials."""
    return feasibility_for(baseline, settings, metric_higher_is_better=metric_higher_is_better)


def first_level_size(settings: SearchSettings, num_layers: int) -> int:
    """Evaluations a strategy's first level needs, the dense baseline included."""
    allowed = settings.allowed_layers(num_layers)
    if settings.mode in ("random", *OPTUNA_MODES):
        return 2  # the baseline and one drawn / proposed skip set
    return 1 + len(allowed)  # the baseline and every single-layer skip


def check_budget(settings: SearchSettings, num_layers: int) -> None:
    """Refuse a budget a strategy cannot start with.

    The breadth-first modes keep their documented behaviour (``max_trials`` keeps a prefix
    of a level, even of level 1).

    Raises:
        ValueError: A randomised strategy without ``max_trials``, or ``max_trials`` below
            the strategy's first level; the message says how many evaluations it needs.
    """
    mode = settings.mode
    if mode in BFS_MODES:
        return
    need = first_level_size(settings, num_layers)
    if settings.max_trials is None:
        if mode in ("random", *OPTUNA_MODES):
            raise ValueError(
                f"mode={mode!r} needs a budget: set max_trials (at least {need}: the dense "
                "baseline and one skip set), e.g. max_trials=60."
            )
        return
    if settings.max_trials < need:
        n = need - 1
        what = (
            f"the dense baseline and {n} single-layer skip(s) of the allowed layers"
            if mode not in ("random", *OPTUNA_MODES)
            else "the dense baseline and one skip set"
        )
        raise ValueError(
            f"max_trials={settings.max_trials} is too small for mode={mode!r}: its first level "
            f"needs {need} evaluations ({what}); use max_trials >= {need}."
        )


def _greedy_key(mode: str, settings: SearchSettings, hib: bool):
    sign = 1.0 if hib else -1.0
    by_accept = mode == "sleb" and settings.sleb_score == "accept_length"

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
    mode = settings.mode
    allowed = settings.allowed_layers(num_layers)
    key = _greedy_key(mode, settings, metric_higher_is_better)
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
            if mode == "gm_skip" and not restrict(thr, "metric").satisfied(results[best]):  # type: ignore[arg-type]
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


def plan_strategy(
    settings: SearchSettings,
    num_layers: int,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> SearchPlan:
    """The plan of any queued strategy (``settings.mode`` in :data:`QUEUED_MODES`)."""
    mode = settings.mode
    hib = metric_higher_is_better
    if mode in BFS_MODES:
        return plan_search(settings, num_layers, results, metric_higher_is_better=hib)
    if mode in ONE_OBJECTIVE_MODES:
        return plan_search(
            settings, num_layers, results, metric_higher_is_better=hib,
            objective=ONE_OBJECTIVE_MODES[mode],
        )
    if mode in GREEDY_MODES:
        return plan_greedy(settings, num_layers, results, metric_higher_is_better=hib)
    if mode == "random":
        return plan_random(settings, num_layers, results, metric_higher_is_better=hib)
    raise ValueError(
        f"mode={mode!r} is not a queued strategy; expected one of: {', '.join(QUEUED_MODES)} "
        f"({', '.join(OPTUNA_MODES)} run through tss_opt.search.optuna_strategy)."
    )


class StrategySampler(BreadthFirstSampler):
    """:class:`BreadthFirstSampler` whose plan is that of ``settings.mode`` (any queued mode).

    The queue, claiming, crash retries and resume are those of the breadth-first search;
    only :meth:`plan` differs.
    """

    def __init__(
        self,
        settings: SearchSettings,
        num_layers: int,
        *,
        metric_higher_is_better: bool = True,
        max_crash_retries: int = MAX_CRASH_RETRIES,
    ) -> None:
        super().__init__(
            settings, num_layers, metric_higher_is_better=metric_higher_is_better,
            max_crash_retries=max_crash_retries,
        )
        if settings.mode not in QUEUED_MODES:
            raise ValueError(
                f"mode={settings.mode!r} is not a queued strategy; expected one of: "
                f"{', '.join(QUEUED_MODES)} ({', '.join(OPTUNA_MODES)} run through "
                "tss_opt.search.optuna_strategy)."
            )
        check_budget(settings, num_layers)

    def plan(self, results: dict[Config, Measurement | None]) -> SearchPlan:
        return plan_strategy(
            self.settings, self.num_layers, results,
            metric_higher_is_better=self.metric_higher_is_better,
        )
