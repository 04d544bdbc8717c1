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

from tss_opt.search.algorithm import Config, Thresholds, thresholds_for
from tss_opt.search.evaluator import Evaluator, EvaluatorInfo, measurement_from
from tss_opt.search.progress import Progress
from tss_opt.search.sampler import BreadthFirstSampler, StoredState
from tss_opt.search.study import FAIL_REASON_KEY, config_of, param_name
from tss_opt.storage import fail_stale, record_heartbeat

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
        self._thread_local.cached_all_trials = None
        waiting = self._storage.get_all_trials(
            self._study_id, deepcopy=False, states=(TrialState.WAITING,)
        )
        # Workers try the oldest queued trials in different orders, so they rarely collide.
        candidates = [t._trial_id for t in waiting[:32]]
        random.shuffle(candidates)
        for trial_id in candidates:
            try:
                # Sets RUNNING only if still WAITING: atomic on PostgreSQL/MySQL (row lock)
                # and on SQLite with BEGIN IMMEDIATE.
                taken = self._storage.set_trial_state_values(trial_id, TrialState.RUNNING)
            except UpdateFinishedTrialError:
                continue
            if not taken:
                continue
            self.taken_trial_id = trial_id
            # Heartbeat at once, not only when Study.optimize starts its heartbeat thread, so a
            # worker killed in between still leaves a trial that goes stale.
            record_heartbeat(self._storage, trial_id)
            return optuna.Trial(self, trial_id)
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
        self.thresholds: Thresholds | None = None
        self.evaluations = 0
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
                self.thresholds = state.plan.thresholds
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
        trial_id = self.study.taken_trial_id
        if trial_id is None:
            return None
        trial = self.study._storage.get_trial(trial_id)
        # A trial this worker failed itself carries FAIL_REASON_KEY (see _objective).
        if trial.state == TrialState.FAIL and FAIL_REASON_KEY not in trial.system_attrs:
            return trial
        return None

    def _fail_interrupted(self) -> None:
        """Fail this worker's running trial as interrupted (re-queued, not a crash)."""
        trial_id = self.study.taken_trial_id
        if trial_id is None:
            return
        storage = self.study._storage
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
                trial.storage.set_trial_system_attr(trial._trial_id, FAIL_REASON_KEY, repr(e)[:500])
            except Exception:  # noqa: BLE001 - never mask the original error
                pass
            raise

    def _evaluate(self, trial: optuna.Trial) -> tuple[float, float, float]:
        config = config_of(self.study._storage.get_trial(trial._trial_id))
        if config is None:
            raise RuntimeError(
                f"Trial #{trial.number} carries no skip set; it was not queued by tss_opt"
            )
        # Store the queued parameters (fixed_params): Optuna's plots and samplers see them.
        for i in range(self.sampler.num_layers):
            skipped = trial.suggest_categorical(param_name(i), [False, True])
            assert skipped == (i in config), f"trial #{trial.number}: skip_{i} disagrees"
        raw = self.evaluator(frozenset(config))
        self.evaluations += 1
        m, extras = measurement_from(raw, config)
        thr = self._thresholds(config, m)
        constraints = list(thr.constraints(m))
        feasible = all(c <= 0.0 for c in constraints)
        for key, value in extras.items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("feasible", feasible)
        # Optuna's constraint API (read by study.best_trials)...
        trial.set_constraint("accept_length", constraints[0])
        trial.set_constraint(self.info.metric_name, constraints[1])
        # ...and the legacy list that optuna-dashboard 0.21 reads (the one constraints_func
        # writes): [(A0 - eps_A) - A, (M0 - eps_M) - M], feasible when all <= 0.
        trial.storage.set_trial_system_attr(trial._trial_id, "constraints", constraints)
        self.progress.trial(trial.number, config, m, feasible)
        return (m.accept_length, m.metric, m.cost)

    def _thresholds(self, config: Config, m: Any) -> Thresholds:
        if not config:
            return thresholds_for(
                m,
                self.sampler.settings,
                metric_higher_is_better=self.sampler.metric_higher_is_better,
            )
        if self.thresholds is None:
            # Another worker finished the baseline while this one was inside optimize.
            self.thresholds = self.sampler.state(self.study).plan.thresholds
        assert self.thresholds is not None, "level >= 1 runs only after the baseline"
        return self.thresholds
