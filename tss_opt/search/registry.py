"""The strategy registry: every search ``mode`` and how it is run, in one place.

What differs between modes is declared once, on the mode itself
(:class:`~tss_opt.config.search.ModeSpec`, ``Mode.<name>.spec``: planner kind, Optuna
sampler, seeded, greedy stop, one objective, budget). This module turns a spec into the
functions that run it: a *planner* (a pure function from the stored results to a
:class:`~tss_opt.search.algorithm.SearchPlan`, run by the shared queue and workers: several
workers may join) or an *Optuna sampler* (run in one process by
:mod:`tss_opt.search.optuna_strategy`). Code elsewhere asks :func:`strategy_for` (or
``settings.mode_spec``) and never compares mode names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from optuna.samplers import BaseSampler

from tss_opt.config.search import MODES, Mode, ModeSpec, SearchSettings
from tss_opt.search.algorithm import Config, Measurement, SearchPlan, plan_search
from tss_opt.search.optuna_samplers import SAMPLER_BUILDERS
from tss_opt.search.planners import plan_greedy, plan_one_objective, plan_random

__all__ = [
    "PLANNERS",
    "QUEUED_MODES",
    "STRATEGIES",
    "Strategy",
    "check_budget",
    "first_level_size",
    "plan_strategy",
    "strategy_for",
]

Planner = Callable[..., SearchPlan]
SamplerFactory = Callable[[int, int], BaseSampler]

# ModeSpec.plan -> the planner that replays it.
PLANNERS: Mapping[str, Planner] = {
    "breadth_first": plan_search,
    "greedy": plan_greedy,
    "random": plan_random,
    "one_objective": plan_one_objective,
}


@dataclass(frozen=True)
class Strategy:
    """How one mode searches: its :class:`~tss_opt.config.search.ModeSpec` with the
    functions that run it.

    Attributes:
        mode: The ``mode`` setting.
        planner: ``planner(settings, num_layers, results, metric_higher_is_better=...)``
            for queued strategies, else ``None``.
        sampler: ``sampler(seed, max_trials)`` for Optuna-sampler strategies, else ``None``.
    """

    mode: Mode
    planner: Planner | None = None
    sampler: SamplerFactory | None = None

    @property
    def spec(self) -> ModeSpec:
        """What the mode is (seeded, greedy, budget, ...)."""
        return self.mode.spec

    @property
    def queued(self) -> bool:
        """Run by the shared queue and workers (several workers may join)."""
        return self.spec.queued

    @property
    def breadth_first(self) -> bool:
        """Algorithm 1 itself (see :attr:`ModeSpec.breadth_first`)."""
        return self.spec.breadth_first


def _strategy(mode: Mode) -> Strategy:
    spec = mode.spec
    if spec.queued:
        return Strategy(mode, planner=PLANNERS[spec.plan])
    return Strategy(mode, sampler=SAMPLER_BUILDERS[spec.sampler])


# One strategy per member of Mode, built from its spec (no second list of modes).
STRATEGIES: Mapping[str, Strategy] = {m.value: _strategy(m) for m in Mode}

# Strategies run by the shared queue and workers (several workers may join).
QUEUED_MODES = tuple(m for m in MODES if STRATEGIES[m].queued)


def strategy_for(mode: str) -> Strategy:
    """The strategy of ``mode``.

    Raises:
        ValueError: An unknown mode (the message lists the modes).
    """
    mode = str(getattr(mode, "value", mode))
    try:
        return STRATEGIES[mode]
    except KeyError:
        raise ValueError(f"Unknown mode {mode!r}; expected one of: {', '.join(MODES)}.") from None


def first_level_size(settings: SearchSettings, num_layers: int) -> int:
    """Evaluations a strategy's first level needs, the dense baseline included."""
    if strategy_for(settings.mode).spec.first_level_one:
        return 2  # the baseline and one drawn / proposed skip set
    return 1 + len(settings.allowed_layers(num_layers))  # the baseline and every single skip


def check_budget(settings: SearchSettings, num_layers: int) -> None:
    """Refuse a budget a strategy cannot start with.

    The breadth-first modes keep their documented behaviour (``max_trials`` keeps a prefix
    of a level, even of level 1).

    Raises:
        ValueError: A strategy that needs a budget without ``max_trials``, or ``max_trials``
            below the strategy's first level; the message says how many evaluations it needs.
    """
    strategy = strategy_for(settings.mode)
    spec = strategy.spec
    if spec.breadth_first:
        return
    mode = strategy.mode
    need = first_level_size(settings, num_layers)
    if settings.max_trials is None:
        if spec.needs_budget:
            raise ValueError(
                f"mode={mode!r} needs a budget: set max_trials (at least {need}: the dense "
                "baseline and one skip set), e.g. max_trials=60."
            )
        return
    if settings.max_trials < need:
        what = (
            "the dense baseline and one skip set"
            if spec.first_level_one
            else f"the dense baseline and {need - 1} single-layer skip(s) of the allowed layers"
        )
        raise ValueError(
            f"max_trials={settings.max_trials} is too small for mode={mode!r}: its first level "
            f"needs {need} evaluations ({what}); use max_trials >= {need}."
        )


def plan_strategy(
    settings: SearchSettings,
    num_layers: int,
    results: Mapping[Config, Measurement | None],
    *,
    metric_higher_is_better: bool = True,
) -> SearchPlan:
    """The plan of any queued strategy (``settings.mode`` in :data:`QUEUED_MODES`).

    Raises:
        ValueError: ``settings.mode`` runs Optuna's sampler (no plan).
    """
    strategy = strategy_for(settings.mode)
    if strategy.planner is None:
        raise ValueError(
            f"mode={strategy.mode!r} is not a queued strategy; expected one of: "
            f"{', '.join(QUEUED_MODES)} (the others run through tss_opt.search.optuna_strategy)."
        )
    return strategy.planner(
        settings, num_layers, results, metric_higher_is_better=metric_higher_is_better
    )
