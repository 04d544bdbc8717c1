"""Progress bars that stay out of logs: tqdm on a terminal, nothing elsewhere.

Every long-running command shows a tqdm bar per unit of work (the search per level, validation,
the held-out report per domain, training, the benchmarks) **only when it can be drawn**:

- bars go to ``stderr``, and only when ``stderr`` is a terminal: a log file, a pipe or a CI
  runner gets no carriage returns and no half-drawn bars;
- ``TQDM_DISABLE=1`` (tqdm's own switch) turns every bar off; the other ``TQDM_*``
  variables (``TQDM_MININTERVAL``, ``TQDM_NCOLS``...) reach tqdm unchanged;
- while bars are drawn, :func:`bars_and_logs` sends the console log handlers' lines through
  ``tqdm.write``, so a log line is printed above the bars instead of through them. The
  handlers keep their format, level and filters (the storage-password filter among them);
  file handlers (Hydra's run log) are untouched.

Without a terminal the libraries' own bars (transformers, huggingface_hub) are turned off too
(:func:`quiet_library_bars`, called when a model loads), and the same information is in the log lines (one per trial and per level at
INFO, see :mod:`tss_opt.search.progress`), so nothing is lost in a CI log.

Prompt-level progress: a caller opens :func:`prompt_bar` around an evaluation, and the
evaluators report each finished prompt (or batch) with :func:`prompts_done`; with no bar open
that call does nothing, so evaluators need not know who watches them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import IO, Any

from tqdm.auto import tqdm

__all__ = [
    "bars_and_logs",
    "bars_shown",
    "held_library_bars",
    "progress_bar",
    "prompt_bar",
    "prompts_done",
    "quiet_library_bars",
]

# Values of TQDM_DISABLE that leave bars on (tqdm reads the variable as a bool; an empty or
# "0"/"false" value means "not disabled").
_FALSE = {"", "0", "false", "no", "off"}


def bars_shown(file: IO[str] | None = None) -> bool:
    """Whether a bar written to ``file`` (default ``sys.stderr``) is drawn: ``TQDM_DISABLE``
    is not set to a true value and ``file`` is a terminal."""
    if os.environ.get("TQDM_DISABLE", "").strip().lower() not in _FALSE:
        return False
    stream = sys.stderr if file is None else file
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def progress_bar(
    total: float | None = None,
    desc: str = "",
    *,
    unit: str = "it",
    enabled: bool = True,
    leave: bool = True,
    file: IO[str] | None = None,
    **kwargs: Any,
) -> tqdm:
    """A tqdm bar on ``stderr`` (or ``file``), drawn only where :func:`bars_shown` says so.

    Args:
        total: Units of work (``None``: unknown, no ETA).
        desc: The label in front of the bar.
        unit: What one unit is (``trial``, ``prompt``, ``step``).
        enabled: The caller's own switch (e.g. ``train.progress``); ``False`` never draws.
        leave: Keep the finished bar on screen (``False`` for inner bars).
        file: Where to draw (default ``sys.stderr``).
        **kwargs: Passed to tqdm (``initial``, ``postfix``, ``position``...).

    Returns:
        The bar; a disabled bar accepts every call and prints nothing.
    """
    stream = sys.stderr if file is None else file
    return tqdm(
        total=total, desc=desc, unit=unit, file=stream, leave=leave, dynamic_ncols=True,
        disable=not (enabled and bars_shown(stream)), **kwargs,
    )


class _BarLogHandler(logging.Handler):
    """Writes a console handler's records through ``tqdm.write`` (bars redrawn below them)."""

    def __init__(self, original: logging.StreamHandler[Any]) -> None:
        super().__init__(original.level)
        self.stream = original.stream
        self.setFormatter(original.formatter)
        for f in original.filters:  # e.g. the storage-password filter: never drop it
            self.addFilter(f)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (sys.stdout, sys.stderr)


@contextlib.contextmanager
def bars_and_logs() -> Iterator[None]:
    """While inside, console log lines are written above the bars (module docstring).

    Does nothing when bars are not drawn (no terminal, ``TQDM_DISABLE``), so logs and their
    handlers stay exactly as configured. Covers the root logger and every logger with its
    own console handler (Optuna's).
    """
    if not bars_shown():
        yield
        return
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger) and lg.handlers
    ]
    saved = [(lg, lg.handlers) for lg in loggers]
    try:
        for lg, handlers in saved:
            if any(_is_console(h) for h in handlers):
                lg.handlers = [_BarLogHandler(h) if _is_console(h) else h for h in handlers]  # type: ignore[arg-type]
        yield
    finally:
        for lg, handlers in saved:
            lg.handlers = handlers


def quiet_library_bars() -> None:
    """Where bars are not drawn, turn off the libraries' own: transformers' (GGUF conversion,
    "Loading weights", "Writing model shards") and huggingface_hub's downloads draw theirs into
    a log file too, one carriage-return line each (seen in the README command's captured output).
    On a terminal they stay."""
    if bars_shown():
        return
    import transformers.utils.logging as transformers_logging
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    transformers_logging.disable_progress_bar()


# One redraw of a tqdm bar in its default format: "desc:  23%|██▎       | 63/272 [00:01<...".
_BAR_REDRAW = re.compile(r"\d+%\|.*\| *[\d.]+[kMG]?/[\d.?]+[kMG]? \[")


@contextlib.contextmanager
def held_library_bars() -> Iterator[None]:
    """For a library call that draws a tqdm bar without a switch (transformers' GGUF reader):
    off a terminal, what the block writes to ``sys.stderr`` is held and written back without
    the bar's redraws; on a terminal nothing changes."""
    if bars_shown():
        yield
        return
    real, held = sys.stderr, io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        for line in re.split(r"[\r\n]+", held.getvalue()):
            if line.strip() and not _BAR_REDRAW.search(line):
                real.write(line + "\n")
        real.flush()


_PROMPT_BAR: ContextVar[tqdm | None] = ContextVar("tss_opt_prompt_bar", default=None)


@contextlib.contextmanager
def prompt_bar(total: int | None, desc: str, *, enabled: bool = True, leave: bool = False) -> Iterator[tqdm]:
    """A bar of prompts that :func:`prompts_done` advances while the block runs.

    Args:
        total: Prompt evaluations expected (``None``: unknown).
        desc: The label (e.g. ``validation`` or ``trial #12 [3, 7]``).
        enabled: ``False``: no bar (the evaluators' calls do nothing).
        leave: Keep it on screen when done (inner bars vanish by default).
    """
    bar = progress_bar(total, desc, unit="prompt", enabled=enabled, leave=leave)
    token = _PROMPT_BAR.set(bar)
    try:
        yield bar
    finally:
        _PROMPT_BAR.reset(token)
        bar.close()


def prompts_done(n: int = 1) -> None:
    """Advance the innermost open :func:`prompt_bar` by ``n`` prompts (no bar: nothing)."""
    bar = _PROMPT_BAR.get()
    if bar is not None:
        bar.update(n)
