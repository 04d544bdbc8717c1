"""The scheduler: one thread owns the model and decodes every admitted request in one
continuous batch.

Requests wait in a bounded FIFO queue (``max_queue``; one more answers 429). Before every
step the scheduler admits waiting requests in arrival order while the batch has room
(``max_batch``) and takes out the rows whose clients went away; then one
:meth:`~tss_opt.decoding.batch.BatchEngine.step` runs the new rows' prefills and a
speculative step of every running row in one target forward, each row on its own domain's
skip set. A row leaves as soon as it finishes, is cancelled or hits a stop string, and a
request arriving meanwhile joins at the next step: nobody waits for a wave.

The HTTP side never waits on the scheduler while holding anything: the scheduler hands each
request's events (text deltas, the result, an error) to the request's asyncio queue through
the event loop (``call_soon_threadsafe``), which never blocks, so a client that stops reading
a stream cannot stall the batch.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tss_opt.decoding.batch import BatchEngine, Row
from tss_opt.decoding.batch_budget import DepthPolicy
from tss_opt.runtime.controller import Admission, ControllerResult, TSSController
from tss_opt.runtime.server.errors import APIError
from tss_opt.runtime.server.text import TextTracker

__all__ = ["Event", "GenerationWorker", "Job", "QueueFull"]

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """Every waiting slot is taken."""


@dataclass
class Event:
    """What the scheduler tells a request: ``kind`` is ``"delta"`` (``text``), ``"done"``
    (``result``), ``"error"`` (``error``) or ``"cancelled"`` (``result``: what was generated
    before the cancellation was seen; ``None`` when the job never started). ``"done"``,
    ``"error"`` and ``"cancelled"`` are a job's last event from the scheduler.

    ``"shutdown"`` (``error``) is never sent by the scheduler: the server puts it on a running
    job's queue when the shutdown grace period ends (``ServingState.drain``).
    """

    kind: str
    text: str = ""
    result: ControllerResult | None = None
    error: BaseException | None = None


@dataclass(eq=False)
class Job:
    """One request waiting for or decoding in the batch.

    Attributes:
        prompt: What the controller generates from: token ids (``torch.LongTensor`` of shape
            ``(P,)``) or chat messages.
        domain: The request's label (``None``: the router decides).
        max_tokens, temperature, seed: The request's generation settings.
        tracker: Follows the output text (stop strings, stream deltas).
        stream: Send text deltas while decoding.
    """

    prompt: torch.Tensor | Sequence[dict[str, str]]
    domain: str | None
    max_tokens: int
    temperature: float | None
    seed: int | None
    tracker: TextTracker
    stream: bool
    loop: asyncio.AbstractEventLoop
    eos_token_ids: tuple[int, ...] = ()
    prompt_param: str = "prompt"  # the request field errors about the prompt name
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, event: Event) -> None:
        """Hand an event to the request's coroutine (from the scheduler thread; never blocks)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is stopping
            self.cancel()


@dataclass(eq=False)
class _Running:
    """A job in the batch: its admission and the controller that admitted it (a mapping
    reloaded meanwhile does not change a running row)."""

    job: Job
    admission: Admission
    controller: TSSController


class GenerationWorker:
    """Admits :class:`Job` s into one continuous batch and steps it on a thread of its own.

    Args:
        controller: Returns the controller to admit the next job with (the mapping reloader's
            ``check``; called on the scheduler thread before each admission).
        max_queue: Jobs that may wait; :meth:`submit` raises :class:`QueueFull` beyond.
        max_batch: Rows decoding at once; waiting jobs join as rows leave.
        draft_depth: Chooses each step's draft depth from the batch (``None``: rows draft as
            alone).
    """

    def __init__(
        self,
        controller: Callable[[], TSSController],
        max_queue: int,
        max_batch: int = 16,
        draft_depth: DepthPolicy | None = None,
    ) -> None:
        self._controller = controller
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="tss-scheduler", daemon=True)
        self.max_batch = max_batch
        self.draft_depth = draft_depth
        self._batch: BatchEngine | None = None
        self._running: dict[Row, _Running] = {}
        self._stopping = False
        self.served = 0  # jobs admitted into the batch (the model started on them)
        self.steps = 0
        self.peak_batch = 0  # the most rows one step carried
        self.draining = False  # drain() was called: submit refuses

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop: decoding rows end after the current step, waiting jobs are cancelled."""
        self._stopping = True
        for r in list(self._running.values()):
            r.job.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.emit(Event("cancelled"))
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    # ------------------------------------------------------------------------ observing
    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the rows decoding)."""
        return self._queue.qsize()

    @property
    def batch_size(self) -> int:
        """Rows decoding now."""
        return len(self._running)

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def rows_per_skip_set(self) -> dict[str, int]:
        """Rows decoding now per skip set (``"3,14"``; ``""``: dense)."""
        return dict(Counter(",".join(str(i) for i in sorted(r.admission.skip_set)) for r in list(self._running.values())))

    def submit(self, job: Job) -> None:
        if self.draining:
            raise QueueFull
        try:
            self._queue.put_nowait(job)
        except queue.Full as e:
            raise QueueFull from e

    # ------------------------------------------------------------------ shutdown
    def drain(self, error: BaseException) -> int:
        """Shutdown, first step: take no new job and answer every waiting one.

        Contract (the server's SIGTERM handling relies on it, ``ServingState.drain``):
        afterwards :meth:`submit` raises :class:`QueueFull`; every job that had not joined the
        batch leaves the queue and gets exactly one event, ``Event("error", error=error)``,
        and nothing after it; rows already decoding are not touched and end as usual (their
        ``done``, ``cancelled`` or ``error`` event; :meth:`Job.cancel` takes one out of the
        batch at the next step). Called on the event loop's thread; never blocks.

        Returns:
            How many waiting jobs were answered.
        """
        self.draining = True
        answered, sentinel = 0, False
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # stop() was called first: keep its sentinel for the thread
                sentinel = True
                continue
            job.emit(Event("error", error=error))
            answered += 1
        if sentinel:
            self._queue.put_nowait(None)
        return answered

    # --------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        while True:
            try:
                if not self._cycle():
                    return
            except Exception as e:  # the scheduler outlives every request: fail the batch, go on
                log.exception("the scheduler failed; its %d running requests answer 500", len(self._running))
                self._fail_all(e)

    def _cycle(self) -> bool:
        """Admit, take out the cancelled, step once. False when told to stop."""
        if not self._running:  # idle: wait for work
            job = self._queue.get()
            if job is None:
                return False
            self._admit(job)
        while len(self._running) < self.max_batch:  # room: the waiting join now
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._cancel_all()
                return False
            self._admit(job)
        for row, r in list(self._running.items()):  # clients that went away leave at once
            if r.job.cancelled.is_set():
                self._leave(row, r)
        if self._running:
            self._step()
        return True

    def _admit(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.emit(Event("cancelled"))
            return
        try:
            controller = self._controller()
            if self._batch is None:
                self._batch = controller.new_batch(self.draft_depth)
            # On this thread, between steps: the router's forward for an unlabeled request
            # never overlaps a step.
            admission = controller.admit(
                self._batch, job.prompt, job.domain, max_new_tokens=job.max_tokens, temperature=job.temperature,  # type: ignore[arg-type]
                seed=job.seed, tag=job,
            )
        except ValueError as e:  # the project's user errors (ContextLengthError...): the request's fault
            job.emit(Event("error", error=APIError(400, str(e), param=job.prompt_param)))
            return
        except Exception as e:  # the scheduler outlives every request
            log.exception("admitting a request failed")
            job.emit(Event("error", error=e))
            return
        job.started_at = time.perf_counter()
        self.served += 1  # counted when the model starts on it (tests: "nothing generated")
        self._running[admission.row] = _Running(job, admission, controller)

    def _step(self) -> None:
        assert self._batch is not None
        controller = next(iter(self._running.values())).controller
        self.peak_batch = max(self.peak_batch, len(self._running))
        try:
            with controller.lock:  # a one-shot generate on the same model waits for the step
                steps = self._batch.step()
        except Exception as e:  # a failed forward fails the rows in it, not the server
            log.exception("a batched step failed; its %d requests answer 500", len(self._running))
            self._fail_all(e)
            return
        self.steps += 1
        for s in steps:
            r = self._running.get(s.row)
            if r is None:
                continue
            job = r.job
            job.tracker.add(s.tokens.tolist())
            if job.stream and not job.cancelled.is_set():
                delta = job.tracker.release()
                if delta:
                    job.emit(Event("delta", text=delta))
            if s.done or job.cancelled.is_set() or job.tracker.stopped:
                self._leave(s.row, r)

    def _leave(self, row: Row, r: _Running) -> None:
        """Take a row out of the batch and answer its request (result, or cancelled)."""
        assert self._batch is not None
        self._batch.drop(row)
        self._running.pop(row, None)
        job = r.job
        res = r.controller.result(r.admission)
        if job.cancelled.is_set():
            log.info("request cancelled by its client after %d tokens", int(res.stats.new_tokens))
            job.emit(Event("cancelled", result=res))
            return
        job.emit(Event("done", result=res))

    def _fail_all(self, error: BaseException) -> None:
        for row, r in list(self._running.items()):
            if self._batch is not None:
                self._batch.drop(row)
            del self._running[row]
            r.job.emit(Event("error", error=error))

    def _cancel_all(self) -> None:
        for row, r in list(self._running.items()):
            r.job.cancel()
            self._leave(row, r)
