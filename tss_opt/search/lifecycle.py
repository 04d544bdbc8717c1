"""A trial's life in one worker: take it, evaluate it, tell its result.

Each step leaves the storage in a state the next run reads correctly, whatever stops the
worker and wherever:

==================  ============================================  ==========================
step                an interrupt (Ctrl-C) there                   a stall (SIGSTOP) there
==================  ============================================  ==========================
take (WAITING ->    held until the take is recorded; then as in   the trial goes stale, is
RUNNING, first      "evaluate"                                    failed and re-queued by
heartbeat)                                                        another worker
evaluate            the trial is failed with reason               heartbeats stop; as above;
                    ``KeyboardInterrupt()``: re-queued, never     the late result is
                    counted as a crash                            discarded (one info line)
write attributes    held; delivered after the tell                as "evaluate"
tell (RUNNING ->    held: the tell completes, then the worker     the late tell finds the
COMPLETE)           stops                                         trial FAIL and is
                                                                  discarded (one info line)
==================  ============================================  ==========================

"Held" is :class:`~tss_opt.search.interrupts.InterruptGuard`: the worker's storage calls are
never cut in the middle by a Ctrl-C. Trials are driven here instead of by
``Study.optimize``, whose post-processing cannot be interrupted safely (a Ctrl-C in its tell
raised ``UnboundLocalError``; a tell after a stale FAIL raised ``AssertionError: Should not
reach.``, and a stale trial's late writes printed Optuna's warning with a traceback). What
``optimize`` gave is kept: the stale check before each trial (``fail_stale``) and a heartbeat
thread while the trial runs (:class:`~tss_opt.storage.Heartbeat`).

Both the queued strategies (:class:`~tss_opt.search.worker.Worker`) and Optuna's own samplers
(:mod:`tss_opt.search.optuna_strategy`) run their trials through :class:`TrialLife`.

Grouped trials (``search.group_size``): :meth:`TrialLife.take_queued_group` claims
up to ``n`` queued trials one by one (each claim is the same atomic WAITING -> RUNNING write,
so exactly-once holds), and :meth:`TrialLife.run_group` evaluates them together and tells each.
The table holds for every trial of the group: a heartbeat thread per claimed trial; Ctrl-C
while claiming or evaluating fails every claimed, untold trial with ``KeyboardInterrupt()``
(re-queued); an evaluation error fails them all with it as reason; a kill -9 leaves them
RUNNING, stale, re-queued by another worker; a stale trial's late result is discarded alone.
"""

from __future__ import annotations

import contextlib
import logging
import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from tss_opt.search.interrupts import InterruptGuard
from tss_opt.search.study import FAIL_REASON_KEY
from tss_opt.storage import Heartbeat, fail_stale, record_heartbeat
from tss_opt.storage.optuna_adapter import open_trial, study_storage, trial_id

__all__ = ["INTERRUPTED_REASON", "Objective", "TrialLife"]

logger = logging.getLogger("tss_opt.search")

# The fail reason of a trial stopped by Ctrl-C (re-queued; not a crash).
INTERRUPTED_REASON = "KeyboardInterrupt()"

Objective = Callable[[optuna.Trial], Sequence[float]]


class TrialLife:
    """Takes, runs and tells one trial at a time for one worker (see the module docstring).

    Args:
        study: The study (any sampler).
        guard: The search's interrupt guard (held by the caller).
    """

    def __init__(self, study: optuna.Study, guard: InterruptGuard) -> None:
        self.study = study
        self.storage = study_storage(study)
        self.guard = guard
        #: The trial this worker holds RUNNING (``None`` between trials).
        self.current: int | None = None

    # -- take ---------------------------------------------------------------------------

    def take_queued(self) -> optuna.Trial | None:
        """Take a WAITING trial (``None`` when the queue is empty); never creates one.

        ``Study.ask`` would create a parameterless trial when the queue runs dry, which a
        breadth-first search cannot evaluate (the worker must wait for the level instead).
        """
        self.guard.check()
        fail_stale(self.study)  # as Study.optimize does before each trial
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        # Workers try the oldest queued trials in different orders, so they rarely collide.
        candidates = [trial_id(t) for t in waiting[:32]]
        random.shuffle(candidates)
        for tid in candidates:
            try:
                # Sets RUNNING only if still WAITING: atomic on PostgreSQL/MySQL (row lock)
                # and on SQLite with BEGIN IMMEDIATE.
                taken = self.storage.set_trial_state_values(tid, TrialState.RUNNING)
            except UpdateFinishedTrialError:
                continue
            if taken:
                return self._started(tid, None)
        return None

    def take_queued_group(self, n: int) -> list[optuna.Trial]:
        """Take up to ``n`` WAITING trials (fewer when the queue runs dry; ``[]`` when empty).

        Raises:
            KeyboardInterrupt: Ctrl-C between two claims; the trials claimed so far are failed
                with ``KeyboardInterrupt()`` (re-queued) first.
        """
        trials: list[optuna.Trial] = []
        try:
            while len(trials) < n and (trial := self.take_queued()) is not None:
                trials.append(trial)
        except BaseException as e:
            reason = INTERRUPTED_REASON if isinstance(e, KeyboardInterrupt) else repr(e)[:500]
            for trial in trials:
                self._fail(trial_id(trial), reason)
            raise
        finally:
            self.current = None
        return trials

    def ask(self) -> optuna.Trial:
        """A new trial from the study's sampler (``Study.ask``: the queue first)."""
        self.guard.check()
        fail_stale(self.study)
        with warnings.catch_warnings():
            # "Heartbeat of storage is supposed to be used with Study.optimize": this class
            # runs the heartbeat thread itself.
            warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
            trial = self.study.ask()
        return self._started(trial_id(trial), trial)

    def _started(self, tid: int, trial: optuna.Trial | None) -> optuna.Trial:
        # No Ctrl-C is raised between the take's write and this record (the guard holds it).
        self.current = tid
        try:
            # Heartbeat at once, not only when the thread starts, so a worker killed in
            # between still leaves a trial that goes stale.
            record_heartbeat(self.storage, tid)
            return trial if trial is not None else open_trial(self.study, tid)
        except BaseException as e:
            self._fail(tid, INTERRUPTED_REASON if isinstance(e, KeyboardInterrupt) else repr(e)[:500])
            self.current = None
            raise

    # -- evaluate and tell --------------------------------------------------------------

    def run(self, trial: optuna.Trial, objective: Objective) -> FrozenTrial | None:
        """Evaluate ``trial`` and tell its result.

        Returns:
            The COMPLETE trial, or ``None`` when the result was discarded because another
            worker failed the trial as stale while this one was stalled.

        Raises:
            KeyboardInterrupt: Ctrl-C; the trial is COMPLETE (the tell finished) or FAIL
                with reason ``KeyboardInterrupt()`` (re-queued, not counted as a crash).
            Exception: What the objective raised; the trial is failed with it as reason.
        """
        tid = self.current
        assert tid is not None, "run() follows take_queued() or ask()"
        try:
            with Heartbeat(self.storage, tid):
                values = objective(trial)
            done = self._tell(trial, tid, values)
        except KeyboardInterrupt:
            self._fail(tid, INTERRUPTED_REASON)
            raise
        except UpdateFinishedTrialError:
            # A write of the objective (parameters, attributes) found the trial finished.
            if self._discard_if_stale(tid):
                return None
            raise
        except Exception as e:
            # Recorded as the reason, so the trial is re-queued without using up the crash
            # retry (an evaluation error, not a dead worker).
            self._fail(tid, repr(e)[:500])
            raise
        finally:
            self.current = None
        # A Ctrl-C held during the attribute writes or the tell stops the worker only now,
        # with the result stored.
        self.guard.check()
        return done

    def run_group(
        self,
        trials: Sequence[optuna.Trial],
        prepare: Callable[[optuna.Trial], Any],
        evaluate: Callable[[Sequence[Any]], Sequence[Any]],
        finish: Callable[[optuna.Trial, Any], Sequence[float]],
    ) -> list[FrozenTrial | None]:
        """Evaluate the claimed ``trials`` together, then finish and tell each.

        Args:
            trials: From :meth:`take_queued_group`.
            prepare: One trial's set-up writes (its parameters); returns what ``evaluate``
                needs of it. A trial failed as stale meanwhile is dropped here.
            evaluate: Measures the prepared trials together (the heavy part); one result each.
            finish: Writes one trial's attributes from its result and returns its values.

        Returns:
            Per trial, the COMPLETE trial or ``None`` (failed as stale by another worker while
            this one was stalled: its late result is discarded).

        Raises:
            KeyboardInterrupt: Ctrl-C; the trials told so far are COMPLETE, the others FAIL
                with reason ``KeyboardInterrupt()`` (re-queued).
            Exception: What a step raised; every untold trial is failed with it as reason.
        """
        tids = [trial_id(t) for t in trials]
        open_ids = set(tids)  # claimed and neither told nor discarded
        told: dict[int, FrozenTrial | None] = {tid: None for tid in tids}
        try:
            with contextlib.ExitStack() as beats:
                for tid in tids:
                    beats.enter_context(Heartbeat(self.storage, tid))
                kept: list[tuple[optuna.Trial, int, Any]] = []
                for trial, tid in zip(trials, tids, strict=True):
                    try:
                        kept.append((trial, tid, prepare(trial)))
                    except UpdateFinishedTrialError:
                        if not self._discard_if_stale(tid):
                            raise
                        open_ids.discard(tid)
                results = list(evaluate([p for _, _, p in kept])) if kept else []
                assert len(results) == len(kept), "evaluate returns one result per trial"
                for (trial, tid, _), result in zip(kept, results, strict=True):
                    try:
                        told[tid] = self._tell(trial, tid, finish(trial, result))
                    except UpdateFinishedTrialError:
                        if not self._discard_if_stale(tid):
                            raise
                    open_ids.discard(tid)
        except KeyboardInterrupt:
            for tid in tids:
                if tid in open_ids:
                    self._fail(tid, INTERRUPTED_REASON)
            raise
        except Exception as e:
            for tid in tids:
                if tid in open_ids:
                    self._fail(tid, repr(e)[:500])
            raise
        finally:
            self.current = None
        # A Ctrl-C held during the writes or the tells stops the worker only now.
        self.guard.check()
        return [told[tid] for tid in tids]

    def _tell(
        self, trial: optuna.Trial, tid: int, values: Sequence[float]
    ) -> FrozenTrial | None:
        if self._discard_if_stale(tid):
            return None
        try:
            self.study.tell(trial, list(values), state=TrialState.COMPLETE)
        except (UpdateFinishedTrialError, ValueError):
            # Failed as stale between the check above and the write (the worker was stopped
            # in between): "Cannot tell a FAIL trial" or the storage's refusal.
            if self._discard_if_stale(tid):
                return None
            raise
        return self.storage.get_trial(tid)

    def _discard_if_stale(self, tid: int) -> bool:
        """``True`` (and one info line) if another worker failed this trial as stale."""
        trial = self.storage.get_trial(tid)
        if trial.state != TrialState.FAIL or FAIL_REASON_KEY in trial.system_attrs:
            return False
        logger.info(
            "trial #%d (skip set %s) was failed as stale by another worker while this worker "
            "was stalled; its late result is discarded (the retry runs elsewhere)",
            trial.number,
            trial.user_attrs.get("skip_set"),
        )
        return True

    def _fail(self, tid: int, reason: str) -> None:
        """Fail the RUNNING trial ``tid`` with ``reason`` (re-queued, not a crash)."""
        if self.guard.forced:
            # A second Ctrl-C may have cut a storage call short: write nothing more; the
            # trial goes stale and is retried like a dead worker's.
            return
        try:
            if self.storage.get_trial(tid).state != TrialState.RUNNING:
                return  # told already, or failed as stale by another worker
            self.storage.set_trial_system_attr(tid, FAIL_REASON_KEY, reason)
            self.storage.set_trial_state_values(tid, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass  # failed as stale meanwhile
        except Exception as e:  # noqa: BLE001 - never mask the error that stopped the trial
            logger.debug("could not fail trial id %d (%s): %s", tid, reason, e)
