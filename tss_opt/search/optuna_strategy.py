"""Optuna's own samplers (``tpe``, ``nsga2``, ``gp``) on the TSS study space.

The space is the breadth-first search's: ``skip_<i>`` in ``{False, True}`` for every layer
(``CategoricalDistribution``); barrier layers are held at ``False`` by :class:`_Barriers`. The
first trial is the dense baseline (enqueued), which fixes the feasibility rule; every trial
then stores the same user attributes and constraints as a breadth-first trial, and the
sampler reads the constraints the objective sets (``Trial.set_constraint``).

Budget: ``max_trials`` distinct evaluated skip sets, the baseline included. A proposal of a
skip set already evaluated is not evaluated again: its trial completes with the stored values
(so the sampler learns it) and carries ``duplicate_of`` instead of ``skip_set`` (searches and
results ignore it). At most ``5 * max_trials`` proposals are made, then the search stops.
``max_depth`` does not bound these samplers (they search the whole space).

One process only: the duplicate check and the budget are counted in the running process, so
``n_workers_hint > 1`` is refused. Resume works (completed evaluations count against the
budget) but a resumed run need not propose what an uninterrupted one would have (the
samplers' random state is not stored).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from tss_opt.config.search import OPTUNA_MODES, SearchSettings
from tss_opt.search.algorithm import Config, Measurement, Thresholds, canonical
from tss_opt.search.contract import Evaluator, EvaluatorInfo, measurement_from
from tss_opt.search.interrupts import InterruptGuard
from tss_opt.search.lifecycle import TrialLife
from tss_opt.search.progress import Progress
from tss_opt.search.result import SearchResult
from tss_opt.search.sampler import BreadthFirstSampler
from tss_opt.search.strategies import check_budget, feasibility_rule
from tss_opt.search.strategy_result import build_strategy_result
from tss_opt.search.study import config_of, param_name
from tss_opt.storage.optuna_adapter import study_storage, trial_id

__all__ = ["PROPOSALS_PER_EVALUATION", "make_sampler", "run_optuna_strategy", "stored_results"]

logger = logging.getLogger("tss_opt.search")

PROPOSALS_PER_EVALUATION = 5


def make_sampler(mode: str, seed: int, max_trials: int) -> BaseSampler:
    """Optuna's sampler for ``mode``.

    The samplers see the search's constraints through ``Trial.set_constraint`` (what the
    objective writes; Optuna 5 reads them and deprecates ``constraints_func``).

    Startup (random) trials: Optuna's defaults capped at a quarter of the budget, so small
    budgets still reach the model-based phase; NSGA-II's population likewise.
    """
    startup = max(1, min(10, max_trials // 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        if mode == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
        if mode == "nsga2":
            return optuna.samplers.NSGAIISampler(
                seed=seed, population_size=max(4, min(50, max_trials // 4))
            )
        if mode == "gp":
            try:
                import scipy  # noqa: F401
                import torch  # noqa: F401
            except ImportError as e:  # GPSampler needs both
                raise ValueError(
                    f"mode='gp' needs scipy and torch ({e}); install them or pick tpe / nsga2."
                ) from e
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    raise ValueError(f"Unknown Optuna strategy {mode!r}; expected one of: {', '.join(OPTUNA_MODES)}.")


class _Barriers(BaseSampler):
    """Delegates to ``base`` but holds the barrier layers' ``skip_<i>`` at ``False``."""

    def __init__(self, base: BaseSampler, fixed: set[str]) -> None:
        self.base = base
        self.fixed = fixed

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        space = self.base.infer_relative_search_space(study, trial)
        return {k: v for k, v in space.items() if k not in self.fixed}

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):  # type: ignore[no-untyped-def]
        if param_name in self.fixed:
            return False
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):  # type: ignore[no-untyped-def]
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):  # type: ignore[no-untyped-def]
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


def stored_results(
    trials: Sequence[FrozenTrial],
) -> tuple[dict[Config, Measurement | None], dict[Config, FrozenTrial]]:
    """Results per skip set from COMPLETE trials that carry one (duplicates skipped)."""
    results: dict[Config, Measurement | None] = {}
    complete: dict[Config, FrozenTrial] = {}
    for t in sorted(trials, key=lambda t: t.number):
        config = config_of(t)
        if config is None or t.state != TrialState.COMPLETE or config in complete:
            continue
        complete[config] = t
        results[config] = BreadthFirstSampler.measurement(t)
    return results, complete


class _Run:
    """The objective and stop rule of one Optuna-driven search."""

    def __init__(
        self,
        study: optuna.Study,
        settings: SearchSettings,
        evaluator: Evaluator,
        info: EvaluatorInfo,
        progress: Progress,
        guard: InterruptGuard,
    ) -> None:
        self.study = study
        self.guard = guard
        self.settings = settings
        self.evaluator = evaluator
        self.info = info
        self.progress = progress
        self.L = info.num_layers
        self.allowed = settings.allowed_layers(self.L)
        self.results, self.complete = stored_results(study.get_trials(deepcopy=False))
        self.proposals = 0
        self.rule: Thresholds | None = None
        if frozenset() in self.results and self.results[frozenset()] is not None:
            self.rule = self._rule(self.results[frozenset()])  # type: ignore[arg-type]

    def _rule(self, baseline: Measurement) -> Thresholds:
        return feasibility_rule(
            baseline, self.settings, metric_higher_is_better=self.info.metric_higher_is_better
        )

    @property
    def space_size(self) -> int:
        return 2 ** len(self.allowed)

    def should_stop(self) -> str:
        assert self.settings.max_trials is not None
        if len(self.results) >= self.settings.max_trials:
            return f"max_trials={self.settings.max_trials} reached"
        if len(self.results) >= self.space_size:
            return f"every skip set of the {len(self.allowed)} allowed layers evaluated"
        if self.proposals >= PROPOSALS_PER_EVALUATION * self.settings.max_trials:
            return (
                f"{self.proposals} proposals made ({len(self.results)} distinct skip sets); the "
                "sampler keeps proposing evaluated sets"
            )
        return ""

    def objective(self, trial: optuna.Trial) -> tuple[float, float, float]:
        self.proposals += 1
        config = frozenset(
            i for i in range(self.L) if trial.suggest_categorical(param_name(i), [False, True])
        )
        if config in self.results:
            # Already evaluated: reuse its values (the sampler learns them) without a second
            # record of the same skip set.
            m = self.results[config]
            assert m is not None and self.rule is not None
            trial.set_user_attr("duplicate_of", self.complete[config].number)
            self._constraints(trial, self.rule, m)
            return (m.accept_length, m.metric, m.cost)
        level = len(config)
        trial.set_user_attr("skip_set", list(canonical(config)))
        trial.set_user_attr("level", level)
        trial.set_user_attr("num_skipped", level)
        trial.set_user_attr("sparsity", level / self.L)
        with self.guard.interruptible():
            m, extras = measurement_from(self.evaluator(config), config)
        if not config:
            self.rule = self._rule(m)
        assert self.rule is not None, "the dense baseline runs first"
        for key, value in extras.items():
            trial.set_user_attr(key, value)
        if m.per_prompt is not None:
            # As a breadth-first trial stores it: a resumed search rebuilds the same (paired)
            # rule from the stored dense trial, and the same number of constraints per trial.
            trial.set_user_attr("per_prompt", m.per_prompt.to_dict())
        feasible = self._constraints(trial, self.rule, m)
        trial.set_user_attr("feasible", feasible)
        self.progress.trial(trial.number, config, m, feasible)
        self.results[config] = m
        self.complete[config] = study_storage(self.study).get_trial(trial_id(trial))
        return (m.accept_length, m.metric, m.cost)

    def _constraints(self, trial: optuna.Trial, rule: Thresholds, m: Measurement) -> bool:
        constraints = list(rule.constraints(m))
        trial.set_constraint("accept_length", constraints[0])
        trial.set_constraint(self.info.metric_name, constraints[1])
        study_storage(self.study).set_trial_system_attr(trial_id(trial), "constraints", constraints)
        return rule.satisfied(m)


def run_optuna_strategy(
    storage: BaseStorage,
    study_name: str,
    settings: SearchSettings,
    evaluator: Evaluator,
    info: EvaluatorInfo,
    progress: Progress,
    *,
    n_workers_hint: int | None = None,
    guard: InterruptGuard | None = None,
) -> SearchResult:
    """Run (or resume) a ``tpe`` / ``nsga2`` / ``gp`` search in this process.

    Trials run through :class:`~tss_opt.search.lifecycle.TrialLife`, as the queued
    strategies' do (interrupts, stalls, fail reasons).

    Raises:
        ValueError: ``n_workers_hint > 1``, no ``max_trials``, or a budget below 2.
    """
    if n_workers_hint is not None and n_workers_hint > 1:
        raise ValueError(
            f"mode={settings.mode!r} runs in one process (its sampler's duplicate check and "
            f"budget are counted there); got n_workers_hint={n_workers_hint}. Run one worker, "
            "or use a queued strategy (exhaustive, beam, sleb, gm_skip, random, accept_only, "
            "metric_only) for several."
        )
    check_budget(settings, info.num_layers)
    assert settings.max_trials is not None
    base = make_sampler(settings.mode, settings.seed, settings.max_trials)
    allowed = set(settings.allowed_layers(info.num_layers))
    fixed = {param_name(i) for i in range(info.num_layers) if i not in allowed}
    sampler = _Barriers(base, fixed) if fixed else base
    study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
    guard = guard or InterruptGuard()
    run = _Run(study, settings, evaluator, info, progress, guard)
    life = TrialLife(study, guard)
    if frozenset() not in run.results:
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not waiting:
            study.enqueue_trial({param_name(i): False for i in range(info.num_layers)})
    with guard.held(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        while not (reason := run.should_stop()):
            life.run(life.ask(), run.objective)
    return build_strategy_result(
        run.results,
        run.complete,
        settings,
        num_layers=info.num_layers,
        metric_higher_is_better=info.metric_higher_is_better,
        study_name=study_name,
        metric_name=info.metric_name,
        stop_reason=reason,
        finished=True,
    )

