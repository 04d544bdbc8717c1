"""One worker's loop: take queued trials, evaluate them, wait for levels, stop when done.

The worker runs trials inside ``Study.optimize`` (so Optuna's heartbeat thread and its stale
check run for each trial) on a :class:`QueueStudy`, whose ``ask`` only pops queued trials:
when the queue is empty it raises :class:`QueueEmpty` instead of creating a parameterless
trial, which ends ``optimize``. The worker then refills the queue (next level) or waits.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from tss_opt.search.algorithm import Config, Feasibility, Measurement, canonical, feasibility_for
from tss_opt.search.chunked import TrialEvaluation, evaluate_skip_set
from tss_opt.search.contract import Evaluator, EvaluatorError, EvaluatorInfo, prompt_count
from tss_opt.search.feasibility import PairedFeasibility
from tss_opt.search.progress import Progress
from tss_opt.search.sampler import BreadthFirstSampler, StoredState
from tss_opt.search.study import FAIL_REASON_KEY, config_of, param_name
from tss_opt.storage import fail_stale, record_heartbeat
from tss_opt.storage.optuna_adapter import open_trial, study_storage, trial_id

__all__ = ["QueueEmpty", "QueueStudy", "RetryStaleSkipSetCallback", "Worker"]

logger = logging.getLogger("tss_opt.search")

_MIN_POLL_S = 0.05
_MAX_POLL_S = 1.0


class QueueEmpty(Exception):
    """Raised by :meth:`QueueStudy.ask` when no queued trial is left to take."""


class QueueStudy(optuna.Study):
    """A study whose ``ask`` takes a WAITING trial atomically or raises :class:`QueueEmpty`.

    Optuna's ``ask`` creates a fresh, parameterless trial when the queue is empty; in a
    breadth-first search that trial would have nothing to evaluate (a worker waiting for the
    level to finish), so it is never created.
    """

    #: The trial this process took last (``None`` before the first): the worker fails it
    #: with a recorded reason when an interrupt arrives anywhere while it runs.
    taken_trial_id: int | None = None

    def ask(self, fixed_distributions: dict[str, Any] | None = None) -> optuna.Trial:
        # Same as Study.ask (and its _pop_waiting_trial_id), minus the fallback to a new
        # trial. Reading the queue through the study's cached storage also registers the
        # trials there, which Trial.suggest_* needs.
        storage = study_storage(self)
        waiting = self.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        # Workers try the oldest queued trials in different orders, so they rarely collide.
        candidates = [trial_id(t) for t in waiting[:32]]
        random.shuffle(candidates)
        for tid in candidates:
            try:
                # Sets RUNNING only if still WAITING: atomic on PostgreSQL/MySQL (row lock)
                # and on SQLite with BEGIN IMMEDIATE.
                taken = storage.set_trial_state_values(tid, TrialState.RUNNING)
            except UpdateFinishedTrialError:
                continue
            if not taken:
                continue
            self.taken_trial_id = tid
            # Heartbeat at once, not only when Study.optimize starts its heartbeat thread, so a
            # worker killed in between still leaves a trial that goes stale.
            record_heartbeat(storage, tid)
            return open_trial(self, tid)
        raise QueueEmpty


class RetryStaleSkipSetCallback(RetryHeartbeatStaleTrialCallback):
    """Heartbeat-stale callback: re-queue the dead worker's configuration under the lock.

    Optuna's :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` adds the retry as a
    WAITING trial outside any lock, which could race with a worker that queues the same
    configuration; here the retry goes through :meth:`BreadthFirstSampler.fill_queue`
    (which applies ``max_crash_retries``). Studies driven by another sampler get Optuna's
    behaviour.
    """

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if isinstance(study.sampler, BreadthFirstSampler):
            logger.warning(
                "trial #%d (skip set %s) lost its worker (no heartbeat); queueing a retry",
                trial.number,
                trial.user_attrs.get("skip_set"),
            )
            study.sampler.fill_queue(study)
        else:
            super().__call__(study, trial)


class Worker:
    """Runs trials of one study until the search is finished.

    Args:
        study: The study, built with a :class:`BreadthFirstSampler`.
        evaluator: Measures a skip set.
        info: The evaluator's checked description.
        progress: Where progress lines go.
    """

    def __init__(
        self, study: QueueStudy, evaluator: Evaluator, info: EvaluatorInfo, progress: Progress
    ) -> None:
        assert isinstance(study.sampler, BreadthFirstSampler)
        self.study = study
        self.sampler: BreadthFirstSampler = study.sampler
        self.evaluator = evaluator
        self.info = info
        self.progress = progress
        self.thresholds: Feasibility | None = None
        self.baseline: Measurement | None = None
        self.evaluations = 0
        # Prompts generated by this worker (chunked evaluators only): what early stopping saves.
        self.prompt_evaluations = 0
        self._announced_rule = False
        self._last_progress = time.monotonic()

    def run(self) -> StoredState:
        """Work until the search is finished; return the final state."""
        poll = _MIN_POLL_S
        while True:
            # A dead worker's trial is failed here even while nobody starts a new trial;
            # the storage's stale callback then queues its retry.
            fail_stale(self.study)
            # Never wait for the lock: the worker holding it is queueing a level, and what it
            # has queued so far can be taken meanwhile.
            state = self.sampler.fill_queue(self.study, wait=False)
            self.progress.state(state)
            if state.plan.finished:
                return state
            if state.plan.baseline is not None and self.thresholds is None:
                self._set_rule(state.plan.baseline, state.plan.thresholds)
            if state.waiting:
                self._optimize()
                poll = _MIN_POLL_S
                continue
            self.progress.waiting(state)
            time.sleep(poll)
            poll = min(poll * 1.5, _MAX_POLL_S)

    def _optimize(self) -> None:
        try:
            self.study.optimize(
                self._objective, catch=(), gc_after_trial=False, callbacks=[self._after_trial]
            )
        except QueueEmpty:
            pass
        except KeyboardInterrupt:
            # Wherever the interrupt landed (taking the trial, writing parameters or
            # attributes, telling the result), the trial must not count as a crash.
            self._fail_interrupted()
            raise
        except (UpdateFinishedTrialError, ValueError) as e:
            # Our trial was failed as stale by another worker while this one was stalled
            # (stopped, swapped out, heartbeats late) and its retry runs elsewhere: Optuna's
            # tell then raises "Cannot tell a FAIL trial" (ValueError) or a write raises
            # UpdateFinishedTrialError. Discard the late result and carry on.
            trial = self._taken_over()
            if trial is None:
                raise
            logger.warning(
                "trial #%d (skip set %s) was failed as stale by another worker while this "
                "worker was stalled; its late result is discarded (%s)",
                trial.number,
                trial.user_attrs.get("skip_set"),
                e,
            )

    def _taken_over(self) -> FrozenTrial | None:
        """This worker's last trial if another worker failed it as stale, else ``None``."""
        tid = self.study.taken_trial_id
        if tid is None:
            return None
        trial = study_storage(self.study).get_trial(tid)
        # A trial this worker failed itself carries FAIL_REASON_KEY (see _objective).
        if trial.state == TrialState.FAIL and FAIL_REASON_KEY not in trial.system_attrs:
            return trial
        return None

    def _fail_interrupted(self) -> None:
        """Fail this worker's running trial as interrupted (re-queued, not a crash)."""
        trial_id = self.study.taken_trial_id
        if trial_id is None:
            return
        storage = study_storage(self.study)
        try:
            trial = storage.get_trial(trial_id)
            if trial.state == TrialState.RUNNING:
                storage.set_trial_system_attr(trial_id, FAIL_REASON_KEY, "KeyboardInterrupt()")
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except Exception as e:  # noqa: BLE001 - the interrupt itself must still propagate
            logger.debug("could not fail interrupted trial %d: %s", trial_id, e)

    def _after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        # "level k: evaluated x/y" during long levels, at most once per progress interval
        # (it costs a read of the study's new trials).
        now = time.monotonic()
        if now - self._last_progress >= self.progress.interval:
            self._last_progress = now
            self.progress.state(self.sampler.state(self.study), force=True)

    def _objective(self, trial: optuna.Trial) -> tuple[float, float, float]:
        try:
            return self._evaluate(trial)
        except BaseException as e:
            # Mark the failure as an evaluation error or interrupt (not a crash) so it is
            # re-queued without using up the crash retry, wherever in the trial it happened
            # (evaluator, parameters, attributes); then let Optuna fail the trial and re-raise.
            try:
                study_storage(self.study).set_trial_system_attr(
                    trial_id(trial), FAIL_REASON_KEY, repr(e)[:500]
                )
            except Exception:  # noqa: BLE001 - never mask the original error
                pass
            raise

    def _evaluate(self, trial: optuna.Trial) -> tuple[float, float, float]:
        config = config_of(study_storage(self.study).get_trial(trial_id(trial)))
        if config is None:
            raise RuntimeError(
                f"Trial #{trial.number} carries no skip set; it was not queued by tss_opt"
            )
        # Store the queued parameters (fixed_params): Optuna's plots and samplers see them.
        for i in range(self.sampler.num_layers):
            skipped = trial.suggest_categorical(param_name(i), [False, True])
            assert skipped == (i in config), f"trial #{trial.number}: skip_{i} disagrees"
        ev = self._evaluate_skip_set(config)
        self.evaluations += 1
        self.prompt_evaluations += ev.prompts_used or 0
        m, extras = ev.measurement, ev.extras
        self._check_prompt_count(config, ev)
        verdict = self._rule(config, m).verdict(m)
        constraints = list(verdict.constraints)
        feasible = verdict.feasible
        assert feasible == all(c <= 0.0 for c in constraints) or ev.early_stopped
        for key, value in extras.items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("feasible", feasible)
        if m.per_prompt is not None:
            # Compact per-prompt record (4 decimals): feasibility is recomputed from it.
            trial.set_user_attr("per_prompt", m.per_prompt.to_dict())
        if ev.prompts_used is not None:
            trial.set_user_attr("prompts_used", ev.prompts_used)
            trial.set_user_attr("early_stopped", ev.early_stopped)
        if not feasible:
            trial.set_user_attr("infeasible_reason", verdict.reason)
        if verdict.bounds:
            trial.set_user_attr(
                "paired_bounds", {k: b.to_dict() for k, b in verdict.bounds.items()}
            )
        # Optuna's constraint API (read by study.best_trials)...
        for name, value in zip(verdict.constraint_names, constraints, strict=True):
            trial.set_constraint(self.info.metric_name if name == "metric" else name, value)
        # ...and the legacy list that optuna-dashboard 0.21 reads (the one constraints_func
        # writes): point rule [(A0 - eps_A) - A, (M0 - eps_M) - M]; paired rule [-delta_A -
        # lower_A, -delta_M - lower_M(, lower_R - max_repetition_increase)]; feasible when all
        # <= 0.
        study_storage(self.study).set_trial_system_attr(trial_id(trial), "constraints", constraints)
        self.progress.trial(trial.number, config, m, feasible)
        if ev.early_stopped:
            logger.log(
                self.progress.level,
                "trial #%d stopped early after %d prompt(s): %s",
                trial.number,
                ev.prompts_used,
                ev.stop_reason,
            )
        return (m.accept_length, m.metric, m.cost)

    def _set_rule(self, baseline: Measurement, rule: Feasibility | None) -> None:
        self.baseline = baseline
        self.thresholds = rule
        settings = self.sampler.settings
        if settings.feasibility == "paired" and not isinstance(rule, PairedFeasibility):
            if not self._announced_rule:
                self._announced_rule = True
                n = 0 if baseline.per_prompt is None else baseline.per_prompt.n
                logger.warning(
                    "feasibility=paired needs per-prompt values for >= 2 prompts, but the "
                    "evaluator's dense run reported %s; using the point rule (the paper's "
                    "thresholds on the aggregates) for this search",
                    f"{n}" if n else "none",
                )

    def _ensure_rule(self) -> None:
        if self.thresholds is None:
            # Another worker finished the baseline while this one was inside optimize.
            plan = self.sampler.state(self.study).plan
            assert plan.baseline is not None, "level >= 1 runs only after the baseline"
            self._set_rule(plan.baseline, plan.thresholds)

    def _evaluate_skip_set(self, config: Config) -> TrialEvaluation:
        settings = self.sampler.settings
        n = prompt_count(self.evaluator)
        if not (settings.early_stopping and settings.feasibility == "paired" and n is not None):
            return evaluate_skip_set(self.evaluator, config)
        chunk = settings.early_stop_chunk
        if not config:
            # The dense baseline runs every prompt (in the same chunks as the skip sets).
            return evaluate_skip_set(self.evaluator, config, num_prompts=n, chunk=chunk)
        self._ensure_rule()
        rule = self.thresholds if isinstance(self.thresholds, PairedFeasibility) else None
        pool_rule = None
        if rule is not None and len(config) == 1:
            assert self.baseline is not None
            pool = feasibility_for(
                self.baseline,
                settings,
                metric_higher_is_better=self.sampler.metric_higher_is_better,
                pool=True,
            )
            pool_rule = pool if isinstance(pool, PairedFeasibility) else None
        return evaluate_skip_set(
            self.evaluator, config, num_prompts=n, chunk=chunk, rule=rule, pool_rule=pool_rule
        )

    def _check_prompt_count(self, config: Config, ev: TrialEvaluation) -> None:
        """Every skip set reports as many prompts as the dense run (unless stopped early)."""
        if not config:
            return
        self._ensure_rule()
        assert self.baseline is not None
        base = self.baseline.per_prompt
        got = ev.measurement.per_prompt
        want_n = None if base is None else base.n
        got_n = None if got is None else got.n
        if got_n == want_n or (ev.early_stopped and got_n is not None and want_n is not None):
            return

        def says(n: int | None) -> str:
            return "no per_prompt" if n is None else f"per_prompt of length {n}"

        raise EvaluatorError(
            f"The evaluator returned {says(got_n)} for skip set {list(canonical(config))} but "
            f"{says(want_n)} for the dense baseline; per_prompt must have one entry per prompt, "
            "in the same prompt order, for every skip set (or be left out for all)."
        )

    def _rule(self, config: Config, m: Measurement) -> Feasibility:
        if not config:
            return feasibility_for(
                m,
                self.sampler.settings,
                metric_higher_is_better=self.sampler.metric_higher_is_better,
            )
        self._ensure_rule()
        assert self.thresholds is not None
        return self.thresholds
