"""Optuna's own samplers (``tpe``, ``nsga2``, ``gp``) on the TSS study space.

The space is the breadth-first search's: ``skip_<i>`` in ``{False, True}`` for every layer
(``CategoricalDistribution``); barrier layers are held at ``False`` (:func:`~tss_opt.search.optuna_samplers.with_barriers`). The
first trial is the dense baseline (enqueued), which fixes the feasibility rule; every trial
then stores the same user attributes and constraints as a breadth-first trial, and the
sampler reads the constraints the objective sets (``Trial.set_constraint``).

Budget: ``max_trials`` distinct evaluated skip sets, the baseline included. A proposal of a
skip set already evaluated is not evaluated again: its trial completes with the stored values
(so the sampler learns it) and carries ``duplicate_of`` instead of ``skip_set`` (searches and
results ignore it). At most ``5 * max_trials`` proposals are made, then the search stops.
``max_depth`` does not bound these samplers (they search the whole space).

One process only: the duplicate check and the budget are counted in the running process (run
one worker per study). Resume works (completed evaluations count against the
budget) but a resumed run need not propose what an uninterrupted one would have (the
samplers' random state is not stored).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import Config, Feasibility, Measurement, canonical
from tss_opt.search.contract import Evaluator, EvaluatorInfo, measurement_from
from tss_opt.search.interrupts import InterruptGuard
from tss_opt.search.lifecycle import TrialLife
from tss_opt.search.optuna_samplers import with_barriers
from tss_opt.search.progress import Progress
from tss_opt.search.registry import strategy_for
from tss_opt.search.result import SearchResult
from tss_opt.search.sampler import BreadthFirstSampler
from tss_opt.search.strategies import feasibility_rule
from tss_opt.search.strategy_result import build_strategy_result
from tss_opt.search.study import config_of, param_name
from tss_opt.search.trial_attrs import record_constraints, record_evaluation
from tss_opt.storage.optuna_adapter import study_storage, trial_id

__all__ = ["PROPOSALS_PER_EVALUATION", "run_optuna_strategy", "stored_results"]

logger = logging.getLogger("tss_opt.search")

PROPOSALS_PER_EVALUATION = 5


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
        self.rule: Feasibility | None = None
        if frozenset() in self.results and self.results[frozenset()] is not None:
            self.rule = self._rule(self.results[frozenset()])  # type: ignore[arg-type]

    def _rule(self, baseline: Measurement) -> Feasibility:
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
            record_constraints(self.study, trial, self.rule.verdict(m), self.info.metric_name)
            return m.trial_values()
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
        # As a breadth-first trial records it (a resumed search rebuilds the same paired rule
        # from the stored dense trial's per_prompt).
        verdict = self.rule.verdict(m)
        record_evaluation(self.study, trial, m, extras, verdict, metric_name=self.info.metric_name)
        self.progress.trial(trial.number, config, m, verdict.feasible)
        self.results[config] = m
        self.complete[config] = study_storage(self.study).get_trial(trial_id(trial))
        return m.trial_values()



def run_optuna_strategy(
    storage: BaseStorage,
    study_name: str,
    settings: SearchSettings,
    evaluator: Evaluator,
    info: EvaluatorInfo,
    progress: Progress,
    *,
    guard: InterruptGuard | None = None,
) -> SearchResult:
    """Run (or resume) a ``tpe`` / ``nsga2`` / ``gp`` search in this process.

    Trials run through :class:`~tss_opt.search.lifecycle.TrialLife`, as the queued
    strategies' do (interrupts, stalls, fail reasons).

    :func:`~tss_opt.search.run_search` has checked the budget.
    """
    assert settings.max_trials is not None
    factory = strategy_for(settings.mode).sampler
    assert factory is not None, f"mode={settings.mode!r} runs through the queue"
    base = factory(settings.seed, settings.max_trials)
    allowed = set(settings.allowed_layers(info.num_layers))
    fixed = {param_name(i) for i in range(info.num_layers) if i not in allowed}
    sampler = with_barriers(base, fixed)
    study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
    guard = guard or InterruptGuard()
    run = _Run(study, settings, evaluator, info, progress, guard)
    life = TrialLife(study, guard)
    if frozenset() not in run.results:
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not waiting:
            study.enqueue_trial({param_name(i): False for i in range(info.num_layers)})
    feasible = 0 if run.rule is None else sum(
        1 for c, m in run.results.items() if c and m is not None and run.rule.verdict(m).feasible
    )
    progress.budget(settings.max_trials, len(run.results), feasible)
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

