"""Ctrl-C during a search: held while the worker talks to the storage, delivered where safe.

An interrupt that lands inside a storage call can leave the database in a state no later step
can read correctly: a trial set RUNNING that the worker never recorded as taken,
a result half told through Optuna's ``Study.optimize`` (``UnboundLocalError``), a study
created without its identity, or (SQLite) a connection of this very process still holding
the database's write lock, so that its own next statement waits ``busy_timeout`` for itself.
Measured: random SIGINTs around ``Study.ask``/``tell`` on SQLite left such a lock within
18-180 interrupts (in SQLAlchemy's begin, inside a fetch, at a commit's entry).

So the search runs under :meth:`InterruptGuard.held`: a Ctrl-C is recorded, not raised, and
comes out as ``KeyboardInterrupt`` at the next safe point: :meth:`InterruptGuard.check`
between steps of a trial's life cycle, the start of an :meth:`InterruptGuard.interruptible`
block (the evaluator and the worker's idle waits run inside one and are interrupted at
once), or the end of ``held``. A second Ctrl-C while one is pending raises at once wherever
it lands (a storage call waiting on a stopped process must stay abandonable); the trial
is then left to go stale and be retried like a dead worker's.

Only the main thread receives signals; elsewhere (and when the program has replaced Python's
own SIGINT handler) the guard changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["InterruptGuard"]


class InterruptGuard:
    """Holds Ctrl-C (SIGINT) between safe points (see the module docstring).

    Attributes:
        forced: A second Ctrl-C was raised where it landed: the storage may be mid-write,
            so the worker skips its bookkeeping writes and leaves the trial to go stale.
    """

    def __init__(self) -> None:
        self._active = False
        self._open = False
        self._pending = False
        self.forced = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._open:
            raise KeyboardInterrupt
        if self._pending:
            self.forced = True
            raise KeyboardInterrupt
        self._pending = True

    @contextlib.contextmanager
    def held(self) -> Iterator[InterruptGuard]:
        """Hold Ctrl-C for the block; a held one is raised when the block ends normally."""
        if (
            self._active
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        ):
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        self._active = True
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
            self._active = False
        self.check()

    def check(self) -> None:
        """Raise the held Ctrl-C, if any (a safe point)."""
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt

    @property
    def pending(self) -> bool:
        """A Ctrl-C is held."""
        return self._pending

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Deliver Ctrl-C at once inside the block (code that holds no storage transaction:
        the evaluator, sleeps). A Ctrl-C held before the block is raised at its start."""
        self.check()
        if not self._active or self._open:
            yield
            return
        self._open = True
        try:
            yield
        finally:
            self._open = False
