"""The generation worker: one thread owns the model and serves queued requests in arrival
order.

The skip state lives on the model, so requests decode one at a time; a single consumer of
one FIFO queue gives arrival order and keeps outputs from mixing. The HTTP side never waits
on the worker while holding anything: the worker hands each request's events (text deltas,
the result, an error) to the request's asyncio queue through the event loop
(``call_soon_threadsafe``), which never blocks, so a client that stops reading a stream
cannot stall the worker. A request whose client went away is cancelled: skipped if still
waiting, stopped after the current step if decoding (the engine's ``on_step`` hook).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tss_opt.runtime.controller import ControllerResult, TSSController
from tss_opt.runtime.server.errors import APIError
from tss_opt.runtime.server.text import TextTracker

__all__ = ["Event", "GenerationWorker", "Job", "QueueFull"]

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """Every waiting slot is taken."""


@dataclass
class Event:
    """What the worker tells a request: ``kind`` is ``"delta"`` (``text``), ``"done"``
    (``result``), ``"error"`` (``error``) or ``"cancelled"`` (``result``: what was generated
    before the cancellation was seen; ``None`` when the job never started). ``"done"``,
    ``"error"`` and ``"cancelled"`` are a job's last event from the worker.

    ``"shutdown"`` (``error``) is never sent by the worker: the server puts it on a running
    job's queue when the shutdown grace period ends (``ServingState.drain``).
    """

    kind: str
    text: str = ""
    result: ControllerResult | None = None
    error: BaseException | None = None


@dataclass
class Job:
    """One request waiting for or using the model.

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
        """Hand an event to the request's coroutine (from the worker thread; never blocks)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is stopping
            self.cancel()


class GenerationWorker:
    """Serves :class:`Job` s one at a time on a thread of its own.

    Args:
        controller: Returns the controller to serve the next job with (the mapping reloader's
            ``check``; called on the worker thread before each job).
        max_queue: Jobs that may wait; :meth:`submit` raises :class:`QueueFull` beyond.
    """

    def __init__(self, controller: Callable[[], TSSController], max_queue: int) -> None:
        self._controller = controller
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="tss-generation", daemon=True)
        self.busy = False
        self.current: Job | None = None
        self.served = 0  # jobs the model started on
        self.draining = False  # drain() was called: submit refuses

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop: the decoding job ends after its current step, waiting jobs are cancelled."""
        if self.current is not None:
            self.current.cancel()
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

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the one decoding)."""
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        if self.draining:
            raise QueueFull
        try:
            self._queue.put_nowait(job)
        except queue.Full as e:
            raise QueueFull from e

    # ------------------------------------------------------------------ shutdown (issue 32)
    def drain(self, error: BaseException) -> int:
        """Shutdown, first step: take no new job and answer every waiting one.

        Contract (the server's SIGTERM handling relies on it, ``ServingState.drain``):
        afterwards :meth:`submit` raises :class:`QueueFull`; every job that had not started
        decoding leaves the queue and gets exactly one event, ``Event("error", error=error)``,
        and nothing after it; jobs already decoding are not touched and end as usual (their
        ``done``, ``cancelled`` or ``error`` event; :meth:`Job.cancel` stops one after its
        current step). Called on the event loop's thread; never blocks.

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
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                job.emit(Event("cancelled"))
                continue
            self.busy, self.current = True, job
            self.served += 1  # counted when the model starts on it (tests: "nothing generated")
            try:
                self._serve(job)
            except BaseException as e:  # the worker outlives every request
                log.exception("generation failed")
                job.emit(Event("error", error=e))
            finally:
                self.busy, self.current = False, None

    def _serve(self, job: Job) -> None:
        controller = self._controller()
        job.started_at = time.perf_counter()

        def on_step(tokens: torch.Tensor) -> bool:
            job.tracker.add(tokens.tolist())
            if job.stream:
                delta = job.tracker.release()
                if delta:
                    job.emit(Event("delta", text=delta))
            return job.cancelled.is_set() or job.tracker.stopped

        try:
            res = controller.generate(
                job.prompt,  # type: ignore[arg-type]
                job.domain,
                max_new_tokens=job.max_tokens,
                temperature=job.temperature,
                seed=job.seed,
                on_step=on_step,
            )
        except ValueError as e:  # the project's user errors (ContextLengthError...): the request's fault
            job.emit(Event("error", error=APIError(400, str(e), param=job.prompt_param)))
            return
        if job.cancelled.is_set():
            log.info("request cancelled by its client after %d tokens", int(res.stats.new_tokens))
            job.emit(Event("cancelled", result=res))
            return
        job.emit(Event("done", result=res))

