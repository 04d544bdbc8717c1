"""``BreadthFirstSampler``: Algorithm 1 as an Optuna sampler that keeps no private state.

Every decision is recomputed from the trials in the storage, so workers can join, leave or
crash at any time:

1. :meth:`BreadthFirstSampler.state` reads the study's trials, turns them into results per
   skip set, and replays :func:`~tss_opt.search.algorithm.plan_search` over them.
2. :meth:`BreadthFirstSampler.fill_queue` enqueues the configurations of the current level
   that have no trial yet (or whose trial failed and may be retried) as WAITING trials whose
   parameters are already set. It is the only writer of the queue and runs under the study's
   cross-process lock, re-reading the state inside the lock, so no configuration is ever
   queued twice.
   The parameters ``skip_<i>`` travel as ``fixed_params`` (like ``Study.enqueue_trial``);
   the worker running the trial suggests them, which stores them.
3. Workers take WAITING trials with Optuna's own atomic pop (``Study.ask``), which sets a
   trial RUNNING only if it is still WAITING: row locks on PostgreSQL/MySQL, ``BEGIN
   IMMEDIATE`` on SQLite (see :mod:`tss_opt.storage.sqlite`).

A configuration is *done* with a COMPLETE trial, *pending* with a WAITING or RUNNING one.
A FAIL trial whose evaluation raised (error, Ctrl-C) carries ``tss_opt:fail_reason`` and is
simply queued again; a FAIL trial without it was failed as heartbeat-stale (its worker died)
and is retried ``max_crash_retries`` times, after which the configuration is given up on
(evaluated, infeasible) so one poisonous configuration cannot stall the search.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState, create_trial

from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import Config, Measurement, SearchPlan, canonical
from tss_opt.search.feasibility import PerPrompt
from tss_opt.search.registry import QUEUED_MODES, check_budget, plan_strategy, strategy_for
from tss_opt.search.study import FAIL_REASON_KEY, config_of, param_name, study_lock_key
from tss_opt.storage import study_lock
from tss_opt.storage.optuna_adapter import study_storage

__all__ = ["MAX_CRASH_RETRIES", "BreadthFirstSampler", "StoredState"]

logger = logging.getLogger("tss_opt.search.sampler")

# A trial whose worker died is run once more elsewhere (RetryHeartbeatStaleTrialCallback's
# max_retry=1); a second death gives the configuration up.
MAX_CRASH_RETRIES = 1


@dataclass
class StoredState:
    """The search state read back from the storage.

    Attributes:
        plan: Algorithm 1 replayed over the stored results.
        results: Final results per skip set (``None``: given up after crashes).
        complete: The COMPLETE trial of each done skip set.
        pending: WAITING/RUNNING trials per skip set.
        failed: FAIL trials per skip set.
        missing: Frontier skip sets that need a (new) trial.
    """

    plan: SearchPlan
    results: dict[Config, Measurement | None]
    complete: dict[Config, FrozenTrial]
    pending: dict[Config, list[FrozenTrial]]
    failed: dict[Config, list[FrozenTrial]]
    missing: list[Config] = field(default_factory=list)

    @property
    def waiting(self) -> list[FrozenTrial]:
        return [t for ts in self.pending.values() for t in ts if t.state == TrialState.WAITING]

    @property
    def running(self) -> list[FrozenTrial]:
        return [t for ts in self.pending.values() for t in ts if t.state == TrialState.RUNNING]


class BreadthFirstSampler(BaseSampler):
    """Breadth-first TSS search (Algorithm 1) driven entirely by the stored trials.

    Args:
        settings: The search settings.
        num_layers: L, the target's decoder layer count; one ``skip_<i>`` parameter per layer.
        metric_higher_is_better: The metric's direction.
        max_crash_retries: Re-runs of a configuration whose worker died during it.

    Trials get their parameters (as ``fixed_params``) when they are queued, so the Optuna
    sampling hooks have nothing to choose; a trial that was not queued by :meth:`fill_queue` (plain
    ``study.optimize`` with an empty queue) is refused, as ``GridSampler`` refuses
    unqueued parameters. Use :func:`tss_opt.search.run_search` to drive the search.
    """

    def __init__(
        self,
        settings: SearchSettings,
        num_layers: int,
        *,
        metric_higher_is_better: bool = True,
        max_crash_retries: int = MAX_CRASH_RETRIES,
    ) -> None:
        settings.validate(num_layers)
        if not strategy_for(settings.mode).queued:
            raise ValueError(
                f"mode={settings.mode!r} is not a queued strategy; expected one of: "
                f"{', '.join(QUEUED_MODES)} (the others run through "
                "tss_opt.search.optuna_strategy)."
            )
        check_budget(settings, num_layers)
        self.settings = settings
        self.num_layers = num_layers
        self.metric_higher_is_better = metric_higher_is_better
        self.max_crash_retries = max_crash_retries

    # -- state ---------------------------------------------------------------------------

    def state(self, study: optuna.Study) -> StoredState:
        """Rebuild the search state from the study's trials (one storage read)."""
        trials = study.get_trials(deepcopy=False)
        return self.state_from_trials(trials)

    def state_from_trials(self, trials: Sequence[FrozenTrial]) -> StoredState:
        """Rebuild the search state from a list of trials."""
        complete: dict[Config, FrozenTrial] = {}
        pending: dict[Config, list[FrozenTrial]] = defaultdict(list)
        failed: dict[Config, list[FrozenTrial]] = defaultdict(list)
        for t in trials:
            config = config_of(t)
            if config is None:
                continue
            if t.state == TrialState.COMPLETE:
                if config in complete:
                    logger.warning(
                        "skip set %s has two complete trials (#%d, #%d); using the first",
                        list(canonical(config)),
                        complete[config].number,
                        t.number,
                    )
                else:
                    complete[config] = t
            elif t.state in (TrialState.WAITING, TrialState.RUNNING):
                pending[config].append(t)
            else:  # FAIL, PRUNED
                failed[config].append(t)
        results: dict[Config, Measurement | None] = {
            c: self.measurement(t) for c, t in complete.items()
        }
        for config, fails in failed.items():
            if config not in complete and config not in pending:
                if self.crashes(fails) > self.max_crash_retries:
                    results[config] = None
        plan = self.plan(results)
        missing = [c for c in plan.frontier if c not in pending]
        return StoredState(plan, results, complete, dict(pending), dict(failed), missing)

    def plan(self, results: dict[Config, Measurement | None]) -> SearchPlan:
        """The search state implied by ``results``: the plan of ``settings.mode``'s strategy
        (Algorithm 1 for ``exhaustive`` / ``beam``; :mod:`tss_opt.search.registry`)."""
        return plan_strategy(
            self.settings,
            self.num_layers,
            results,
            metric_higher_is_better=self.metric_higher_is_better,
        )

    @staticmethod
    def measurement(trial: FrozenTrial) -> Measurement:
        """The measurement stored in a COMPLETE trial (values, ``tokens_per_s``, ``per_prompt``)."""
        assert trial.values is not None and len(trial.values) == 3
        tps = trial.user_attrs.get("tokens_per_s")
        return Measurement(
            accept_length=float(trial.values[0]),
            metric=float(trial.values[1]),
            cost=float(trial.values[2]),
            tokens_per_s=float(tps) if isinstance(tps, (int, float)) else None,
            per_prompt=PerPrompt.from_dict(trial.user_attrs.get("per_prompt")),
        )

    @staticmethod
    def crashes(fails: Sequence[FrozenTrial]) -> int:
        """How many of ``fails`` died with their worker (no recorded failure reason)."""
        return sum(
            1 for t in fails if t.state == TrialState.FAIL and FAIL_REASON_KEY not in t.system_attrs
        )

    # -- queue ---------------------------------------------------------------------------

    def fill_queue(self, study: optuna.Study, *, wait: bool = True) -> StoredState:
        """Queue the current level's configurations that lack a trial; return the state.

        Cheap when nothing is missing (one read, no lock). Otherwise takes the study lock,
        re-reads the state and queues exactly what is still missing.

        Args:
            study: The study.
            wait: ``False``: when another worker holds the lock (it is queueing), return at
                once instead of waiting, so the caller can start on what is queued already.
        """
        state = self.state(study)
        if not state.missing:
            return state
        lock = study_lock(study_storage(study), study_lock_key(study.study_name), blocking=wait)
        with lock as locked:
            if not locked:
                return state
            state = self.state(study)
            for config in state.missing:
                self._enqueue(study, config, state.failed.get(config, []))
            if state.missing:
                logger.debug(
                    "queued %d configuration(s) of level %d",
                    len(state.missing),
                    state.plan.current.level,
                )
            return self.state(study) if state.missing else state

    def _enqueue(self, study: optuna.Study, config: Config, fails: list[FrozenTrial]) -> None:
        level = len(config)
        params = {param_name(i): i in config for i in range(self.num_layers)}
        user_attrs: dict[str, Any] = {
            "skip_set": list(canonical(config)),
            "level": level,
            "num_skipped": level,
            "sparsity": level / self.num_layers,
        }
        # The parameters travel as `fixed_params` (what Study.enqueue_trial writes) and are
        # stored by the worker that runs the trial: writing L parameters costs ~4 statements
        # each, and doing it here would serialize that work in the one process queueing the
        # level (185 ms per trial on PostgreSQL under load, vs 42 ms without).
        system_attrs: dict[str, Any] = {"fixed_params": params}
        if fails:
            # Same bookkeeping as optuna's RetryHeartbeatStaleTrialCallback, so
            # RetryHeartbeatStaleTrialCallback.retry_history() works on our trials.
            numbers = sorted(t.number for t in fails)
            system_attrs.update(failed_trial=numbers[0], retry_history=numbers)
            logger.info(
                "retrying skip set %s (failed trial(s) %s)", user_attrs["skip_set"], numbers
            )
        study.add_trial(
            create_trial(
                state=TrialState.WAITING,
                user_attrs=user_attrs,
                system_attrs=system_attrs,
            )
        )

    # -- optuna sampler hooks --------------------------------------------------------------

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        raise ValueError(
            f"Trial #{trial.number} asks BreadthFirstSampler for '{param_name}', but this "
            "sampler only runs configurations it queued itself (their parameters are set when "
            "queued). Drive the search with tss_opt.search.run_search, or call "
            "sampler.fill_queue(study) before study.optimize."
        )
