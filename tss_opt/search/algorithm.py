"""Algorithm 1 of TSS as pure functions: levels, candidate pool, feasibility, Pareto, selection.

Nothing here touches Optuna or a model. :func:`plan_search` replays the breadth-first search
over whatever results exist so far and says what the next configurations are; the sampler
calls it on the trials read back from the storage, so the whole search state is a function
of the stored trials (any worker can compute it; none keeps a private queue).
:class:`LevelReplay` holds what every planner (this one and the rival strategies') does per
level: the ``max_trials`` prefix, the dense baseline and its rule, the frontier, the stops.

Orders and tie rules (all deterministic):

- Configurations of one level are listed in canonical order: by their sorted layer tuple
  (``itertools.combinations`` order over the ascending pool). ``max_trials`` keeps a prefix.
- Beam ranking (appendix): higher acceptance, then larger ``|S|``, then higher tokens/s
  (missing counts as lowest), then canonical order.
- Selection (``min_cost``, ``triple_win``) and the Pareto set: :mod:`tss_opt.search.selection`.
- Feasibility: :func:`feasibility_for` gives the paired rule
  (:class:`~tss_opt.search.feasibility.PairedFeasibility`) when the settings ask for it and the
  dense measurement carries per-prompt values for at least 2 prompts, else the point rule
  (:class:`Thresholds`). Both answer ``satisfied`` (feasibility), ``either`` (the pool's OR
  rule), ``constraints`` and ``verdict``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC, OBJECTIVE_NAMES
from tss_opt.config.search import SearchSettings
from tss_opt.search.feasibility import PairedFeasibility, PerPrompt, Verdict
from tss_opt.search.tolerance import MetricTolerance

__all__ = [
    "Config",
    "Feasibility",
    "OBJECTIVES",
    "LevelPlan",
    "LevelReplay",
    "Measurement",
    "OneObjective",
    "SearchPlan",
    "Thresholds",
    "beam_rank_key",
    "candidate_pool",
    "canonical",
    "feasibility_for",
    "plan_search",
    "thresholds_for",
]

Config = frozenset  # frozenset[int]: the skipped layers


def canonical(config: Iterable[int]) -> tuple[int, ...]:
    """The canonical form of a skip set: its layers in ascending order."""
    return tuple(sorted(config))


@dataclass(frozen=True)
class Measurement:
    """What one evaluation of a skip set gave (the objectives Algorithm 1 uses): the typed
    trial result from the evaluator's answer (:func:`~tss_opt.search.contract.measurement_from`)
    to the storage and back (:meth:`trial_values`, :meth:`objectives`).

    ``per_prompt`` holds the per-prompt values (rounded as stored) when the evaluator reports
    them; the paired feasibility rule needs them. Fewer prompts than the dense run's means the
    evaluation was stopped early (it is then infeasible).
    """

    accept_length: float
    metric: float
    cost: float
    tokens_per_s: float | None = None
    per_prompt: PerPrompt | None = None

    def trial_values(self) -> tuple[float, float, float]:
        """The Optuna trial's values, in the study's objective order (:data:`OBJECTIVE_NAMES`)."""
        return (self.accept_length, self.metric, self.cost)

    def objectives(self) -> dict[str, float]:
        """The three objectives by their stored names (:data:`OBJECTIVE_NAMES`)."""
        return dict(zip(OBJECTIVE_NAMES, self.trial_values(), strict=True))


@dataclass(frozen=True)
class Thresholds:
    """Lower bound on acceptance and bound on the metric (lower or upper, per direction)."""

    accept: float
    metric: float
    metric_higher_is_better: bool = True

    def constraints(self, m: Measurement) -> tuple[float, float]:
        """Constraint values ``(c_A, c_M)``; the configuration satisfies both when each <= 0.

        For a higher-is-better metric: ``c_A = (A0 - eps_A) - A`` and ``c_M = (M0 - eps_M) - M``.
        """
        c_metric = (
            self.metric - m.metric if self.metric_higher_is_better else m.metric - self.metric
        )
        return (self.accept - m.accept_length, c_metric)

    def satisfied(self, m: Measurement) -> bool:
        """Both bounds hold (the strict, both-objectives rule of feasibility)."""
        return all(c <= 0.0 for c in self.constraints(m))

    def either(self, m: Measurement) -> bool:
        """At least one bound holds (the permissive rule of the candidate pool)."""
        return any(c <= 0.0 for c in self.constraints(m))

    def verdict(self, m: Measurement) -> Verdict:
        """Feasibility with its reason (the point rule has no bounds)."""
        c_a, c_m = self.constraints(m)
        reasons = []
        if c_a > 0:
            reasons.append(f"{ACCEPT_LENGTH} {m.accept_length:.4f} < bound {self.accept:.4f}")
        if c_m > 0:
            op = "<" if self.metric_higher_is_better else ">"
            reasons.append(f"metric {m.metric:.4f} {op} bound {self.metric:.4f}")
        return Verdict(not reasons, (c_a, c_m), (ACCEPT_LENGTH, METRIC), "; ".join(reasons))


# The rule plan_search applies: the paper's point thresholds or the paired bounds.
Feasibility = Thresholds | PairedFeasibility


# Which objectives drive the breadth-first search (pool, feasibility while searching, beam
# ranking): both (Algorithm 1), or one (the accept_only / metric_only rival strategies).
OBJECTIVES = ("both", "accept", "metric")


@dataclass(frozen=True)
class OneObjective:
    """A feasibility rule restricted to one objective, for the one-objective searches.

    Wraps the rule of the search (today :class:`Thresholds`; any object with
    ``constraints(m) -> (c_A, c_M)``) and keeps only the constraint of ``objective``.
    ``constraints`` is passed through unchanged, so stored trials carry both constraints.
    """

    rule: Thresholds
    objective: str  # "accept" or "metric"

    def constraints(self, m: Measurement) -> tuple[float, float]:
        return self.rule.constraints(m)

    def _own(self, m: Measurement) -> bool:
        return self.rule.constraints(m)[0 if self.objective == "accept" else 1] <= 0.0

    def satisfied(self, m: Measurement) -> bool:
        """The driving objective's bound holds."""
        return self._own(m)

    def either(self, m: Measurement) -> bool:
        """Same as :meth:`satisfied`: with one objective there is no "other" bound."""
        return self._own(m)


def restrict(rule: Thresholds, objective: str) -> Thresholds | OneObjective:
    """``rule`` itself for ``"both"``, else the rule on one objective."""
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown objective {objective!r}; expected one of: {', '.join(OBJECTIVES)}.")
    return rule if objective == "both" else OneObjective(rule, objective)


def _bound(base: float, delta: float, higher_is_better: bool) -> float:
    return base - delta if higher_is_better else base + delta


def thresholds_for(
    baseline: Measurement,
    settings: SearchSettings,
    *,
    metric_higher_is_better: bool = True,
    pool: bool = False,
) -> Thresholds:
    """Feasibility thresholds (eps) or, with ``pool=True``, candidate-pool thresholds (tau)."""
    tol_a = settings.tau_accept if pool else settings.eps_accept
    # relative: A0 * (1 - eps) for a non-negative baseline; |A0| keeps the bound on the
    # "worse" side of a negative baseline too. The metric's tolerance has a floor where
    # native's metric is near 0 (MetricTolerance).
    delta_a = tol_a * abs(baseline.accept_length) if settings.relative else tol_a
    delta_m = MetricTolerance.of(settings, pool=pool).delta(baseline.metric)
    return Thresholds(
        accept=_bound(baseline.accept_length, delta_a, True),
        metric=_bound(baseline.metric, delta_m, metric_higher_is_better),
        metric_higher_is_better=metric_higher_is_better,
    )


def feasibility_for(
    baseline: Measurement,
    settings: SearchSettings,
    *,
    metric_higher_is_better: bool = True,
    pool: bool = False,
) -> Feasibility:
    """The feasibility rule (eps) or, with ``pool=True``, the pool rule (tau) of a search.

    ``settings.feasibility == "paired"`` and a baseline with per-prompt values for >= 2
    prompts give :class:`PairedFeasibility`; otherwise the point :class:`Thresholds`.
    """
    pp = baseline.per_prompt
    if settings.feasibility == "paired" and pp is not None and pp.n >= 2:
        return PairedFeasibility.build(pp, settings, pool=pool, metric_higher_is_better=metric_higher_is_better)
    return thresholds_for(
        baseline, settings, metric_higher_is_better=metric_higher_is_better, pool=pool
    )


def candidate_pool(
    singles: Mapping[int, Measurement | None], pool_thresholds: Feasibility
) -> tuple[int, ...]:
    """Layers whose single skip keeps acceptance OR metric within tau (failed ones excluded)."""
    return tuple(
        sorted(i for i, m in singles.items() if m is not None and pool_thresholds.either(m))
    )


def beam_rank_key(config: Config, m: Measurement) -> tuple:
    """Sort key, best first: acceptance, then |S|, then tokens/s, then canonical order."""
    tps = m.tokens_per_s if m.tokens_per_s is not None else -math.inf
    return (-m.accept_length, -len(config), -tps, canonical(config))


@dataclass(frozen=True)
class LevelPlan:
    """One level of the breadth-first search.

    Attributes:
        level: k, the size of the skip sets (0: the dense baseline).
        configs: The configurations planned at this level, in canonical order.
        total: How many the level has before ``max_trials`` truncation.
        evaluated: How many of ``configs`` have a final result (done or given up).
        feasible: The feasible ones among the evaluated.
    """

    level: int
    configs: tuple[Config, ...]
    total: int
    evaluated: int
    feasible: tuple[Config, ...]

    @property
    def complete(self) -> bool:
        return self.evaluated == len(self.configs)


@dataclass(frozen=True)
class SearchPlan:
    """The search state implied by a set of results.

    Attributes:
        levels: Levels reached so far (the last one may be incomplete).
        baseline: The dense measurement, once known.
        thresholds: The feasibility rule (point thresholds or the paired rule), once the
            baseline is known.
        pool: The candidate pool, once level 1 is complete.
        frontier: Configurations of the current level that still lack a result; empty
            when the search is finished.
        finished: No configuration remains to evaluate.
        stop_reason: Why the search stopped (empty while running).
    """

    levels: tuple[LevelPlan, ...]
    baseline: Measurement | None
    thresholds: Feasibility | None
    pool: tuple[int, ...] | None
    frontier: tuple[Config, ...]
    finished: bool
    stop_reason: str

    @property
    def current(self) -> LevelPlan:
        """The last level reached."""
        return self.levels[-1]

    @property
    def planned(self) -> tuple[Config, ...]:
        """Every configuration planned so far, level by level."""
        return tuple(c for lv in self.levels for c in lv.configs)

    @property
    def feasible(self) -> tuple[Config, ...]:
        """Every feasible configuration so far, the baseline included."""
        return tuple(c for lv in self.levels for c in lv.feasible)


def metric_rank_key(config: Config, m: Measurement, metric_higher_is_better: bool = True) -> tuple:
    """Beam sort key of the metric-only search: better metric, then |S|, tokens/s, order."""
    tps = m.tokens_per_s if m.tokens_per_s is not None else -math.inf
    metric = m.metric if metric_higher_is_better else -m.metric
    return (-metric, -len(config), -tps, canonical(config))


def _next_level(
    k: int,
    settings: SearchSettings,
    pool: Sequence[int],
    prev_feasible: Sequence[Config],
    results: Mapping[Config, Measurement | None],
    objective: str = "both",
    metric_higher_is_better: bool = True,
) -> list[Config]:
    if settings.mode_spec.every_subset:
        children = {frozenset(c) for c in itertools.combinations(pool, k)}
    else:
        if objective == "metric":
            key = lambda c: metric_rank_key(c, results[c], metric_higher_is_better)  # noqa: E731
        else:
            key = lambda c: beam_rank_key(c, results[c])  # noqa: E731
        ranked = sorted(prev_feasible, key=key)
        parents = ranked[: settings.beam_width]
        children = {p | {i} for p in parents for i in pool if i not in p}
    return sorted(children, key=canonical)


class LevelReplay:
    """The bookkeeping every planner shares while it replays its levels over the results.

    A planner (:func:`plan_search`, the rival strategies' planners) lists each level's skip
    sets; :meth:`level` keeps the prefix the ``max_trials`` budget allows, reads the dense
    baseline and the feasibility rule at level 0, records the level's :class:`LevelPlan` and
    says whether the replay stops there. The other methods give the :class:`SearchPlan` of
    the state reached and the stop rules of the budget and ``max_depth``.

    Args:
        settings: The search settings (``max_trials``, ``max_depth``, the feasibility rule).
        results: Final results known so far (as :func:`plan_search`).
        metric_higher_is_better: The metric's direction.

    Attributes:
        budget: Evaluations ``max_trials`` still allows after the recorded levels (``None``:
            no cap).
        levels: The levels recorded so far.
        baseline: The dense measurement, once level 0 has it.
        thresholds: The feasibility rule, once the baseline is known.
        pool: The candidate pool, for the planner that sets one.
    """

    def __init__(
        self,
        settings: SearchSettings,
        results: Mapping[Config, Measurement | None],
        *,
        metric_higher_is_better: bool = True,
    ) -> None:
        self.settings = settings
        self.results = results
        self.metric_higher_is_better = metric_higher_is_better
        self.budget = settings.max_trials
        self.levels: list[LevelPlan] = []
        self.baseline: Measurement | None = None
        self.thresholds: Feasibility | None = None
        self.pool: tuple[int, ...] | None = None

    def level(self, k: int, configs: Sequence[Config], objective: str = "both") -> SearchPlan | None:
        """Record level ``k``, planned as ``configs`` (canonical order).

        Keeps the prefix of ``configs`` the budget allows; at level 0 (the dense baseline)
        sets :attr:`baseline` and :attr:`thresholds`. The level's ``feasible`` are its
        evaluated sets that satisfy the rule on ``objective`` (:func:`restrict`).

        Returns:
            The final plan when the replay stops at this level: the baseline could not be
            evaluated, or skip sets of the level still lack a result (the frontier).
            ``None`` when the level is complete; :attr:`levels` ``[-1]`` holds it.
        """
        results = self.results
        total = len(configs)
        configs = list(configs)
        if self.budget is not None:
            configs = configs[: self.budget]
            self.budget -= len(configs)
        finished = [c for c in configs if c in results]
        unfinished = [c for c in configs if c not in results]
        if k == 0 and finished:
            baseline = results[frozenset()]
            if baseline is None:
                self.levels.append(LevelPlan(0, tuple(configs), total, 1, ()))
                return self.stop("the dense baseline could not be evaluated")
            self.baseline = baseline
            self.thresholds = feasibility_for(
                baseline, self.settings, metric_higher_is_better=self.metric_higher_is_better
            )
        thr = self.thresholds
        drive = restrict(thr, objective) if thr is not None else None
        feasible = [
            c
            for c in finished
            if drive is not None and results[c] is not None and drive.satisfied(results[c])
        ]
        self.levels.append(LevelPlan(k, tuple(configs), total, len(finished), tuple(feasible)))
        if unfinished:
            return self.stop("", unfinished)
        return None

    def cut_short(self, step: str = "level") -> SearchPlan | None:
        """The final plan when the budget ran out inside the last level, else ``None``.

        A level cut short by the budget says nothing about its unevaluated sets, so the
        replay stops before judging it. ``step`` names a level in the stop reason.
        """
        lv = self.levels[-1]
        if self.budget == 0 and len(lv.configs) < lv.total:
            return self.stop(
                f"max_trials={self.settings.max_trials} reached "
                f"({step} {lv.level}: {len(lv.configs)} of {lv.total} evaluated)"
            )
        return None

    def limit(self, k: int) -> SearchPlan | None:
        """The final plan when the budget is spent or level ``k`` is ``max_depth``, else ``None``."""
        if self.budget == 0:
            return self.stop(f"max_trials={self.settings.max_trials} reached")
        if k >= self.settings.max_depth:
            return self.stop(f"max_depth={self.settings.max_depth} reached")
        return None

    def stop(self, reason: str, frontier: Sequence[Config] = ()) -> SearchPlan:
        """The plan of the state reached: finished when ``reason`` is given and no
        ``frontier`` (skip sets still to evaluate) is left."""
        return SearchPlan(
            levels=tuple(self.levels),
            baseline=self.baseline,
            thresholds=self.thresholds,
            pool=self.pool,
            frontier=tuple(frontier),
            finished=not frontier and bool(reason),
            stop_reason=reason,
        )


def plan_search(
    settings: SearchSettings,
    num_layers: int,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
    objective: str = "both",
) -> SearchPlan:
    """Replay Algorithm 1 over ``results`` and return the current state.

    Args:
        settings: The search settings.
        num_layers: L, the target's decoder layer count.
        results: Final results known so far: a :class:`Measurement`, or ``None`` for a
            configuration given up on (crashed too often; it counts as evaluated and
            infeasible). Configurations missing from the mapping are not evaluated yet.
        metric_higher_is_better: The metric's direction.
        objective: ``"both"`` (Algorithm 1), or ``"accept"`` / ``"metric"``: the pool, the
            feasibility that drives the search (levels' ``feasible``, stopping, beam parents)
            and the beam ranking use that objective only. ``thresholds`` stays the
            two-objective rule (what trials store as their constraints).

    Returns:
        The plan: levels so far, baseline, pool, frontier, and whether the search is done.
    """
    allowed = settings.allowed_layers(num_layers)
    replay = LevelReplay(settings, results, metric_higher_is_better=metric_higher_is_better)
    prev_feasible: Sequence[Config] = []
    for k in itertools.count():
        if k == 0:
            configs = [frozenset()]
        elif k == 1:
            configs = [frozenset({i}) for i in allowed]
        else:
            pool = replay.pool
            assert pool is not None
            configs = _next_level(
                k, settings, pool, prev_feasible, results, objective, metric_higher_is_better
            )
            if not configs:
                return replay.stop(
                    f"level {k} has no configuration to evaluate (candidate pool: {list(pool)})"
                )
        if (stop := replay.level(k, configs, objective)) is not None:
            return stop
        level = replay.levels[-1]
        baseline = replay.baseline
        assert baseline is not None
        if k == 1:
            pool_thr = feasibility_for(
                baseline, settings, metric_higher_is_better=metric_higher_is_better, pool=True
            )
            replay.pool = candidate_pool(
                {next(iter(c)): results[c] for c in level.configs}, restrict(pool_thr, objective)
            )
        if (stop := replay.cut_short("level")) is not None:
            return stop
        if k >= 1 and not level.feasible:
            return replay.stop(f"level {k} has no feasible configuration")
        if (stop := replay.limit(k)) is not None:
            return stop
        prev_feasible = level.feasible
    raise AssertionError("unreachable")
