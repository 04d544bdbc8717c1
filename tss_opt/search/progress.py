"""Progress of a search: a bar per level on a terminal, and log lines (logger ``tss_opt.search``).

On a terminal (``stderr`` a TTY, ``TQDM_DISABLE`` unset; :mod:`tss_opt.progress`) each level
gets a bar: trials done of planned, feasible so far, elapsed and estimated time left; a trial's
prompts get an inner bar while it runs. The log lines below are written either way, so a log
file or a CI run shows the same progress without any bar.

At INFO (``show_progress=True``), one line per trial and per level:

- a level starts: ``level 2: 21 configurations planned`` (a worker joining mid-level adds
  ``, 9 evaluated, 3 feasible``)
- per trial, with the level's progress: ``trial #12 level 2 skip [3, 7]: accept_length=2.9100
  f1=0.1310 cost=0.8200 feasible [5/21, feasible 2, 01:10<03:46]`` (``elapsed<left``, the
  estimate from this worker's pace on the level); a trial stopped early says
  ``infeasible, stopped after 8/16 prompts``
- a level completes: ``level 2 complete: evaluated 21/21, feasible 5 (4.9 min)``
- while waiting for other workers (throttled): ``waiting for level 2 to finish: 3 trial(s)
  running elsewhere: #14 [1, 3], ...``
- at the end: the stop reason, S* and the Pareto set.

At DEBUG: the running level's counts (throttled), why a trial stopped early, and the
evaluators' per-chunk and per-prompt lines (``skip=[25] prompts 1-4/4 replayed``). With
``show_progress=False`` every line goes out at DEBUG and no bar is drawn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial
from tqdm import tqdm as _tqdm

from tss_opt.progress import progress_bar
from tss_opt.search.algorithm import Config, Measurement, canonical
from tss_opt.search.sampler import StoredState

__all__ = ["Progress", "logger"]

logger = logging.getLogger("tss_opt.search")


def _fmt(config: Config) -> str:
    return str(list(canonical(config)))


@dataclass
class _Tally:
    """One unit of progress (a level, or a rival strategy's trial budget) as this worker sees it.

    ``done`` and ``feasible`` come from the stored state (every worker's trials) and this
    worker's own trials since; the estimate uses this worker's pace since it first saw the unit.
    """

    label: str
    total: int
    done: int
    feasible: int
    t0: float = field(default_factory=time.monotonic)
    done0: int = 0
    bar: Any = None

    def __post_init__(self) -> None:
        self.done0 = self.done

    def sync(self, done: int, feasible: int) -> None:
        """Counts from the storage (never backwards: this worker may have counted ahead)."""
        self.advance(max(0, done - self.done), max(0, feasible - self.feasible))

    def advance(self, done: int, feasible: int) -> None:
        self.done += done
        self.feasible += feasible
        if self.bar is not None:
            self.bar.set_postfix_str(f"feasible {self.feasible}", refresh=False)
            self.bar.update(done)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def eta(self) -> float | None:
        """Seconds left at this worker's pace on this unit (``None`` before any trial)."""
        n = self.done - self.done0
        if n <= 0:
            return None
        return self.elapsed / n * max(0, self.total - self.done)

    def suffix(self) -> str:
        """``[5/21, feasible 2, 01:10<03:46]`` (``?`` while no estimate exists)."""
        eta = self.eta()
        left = "?" if eta is None else _tqdm.format_interval(eta)
        return f"[{self.done}/{self.total}, feasible {self.feasible}, {_tqdm.format_interval(self.elapsed)}<{left}]"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Progress:
    """Bars and throttled progress lines for one worker.

    Args:
        metric_name: The metric's name, used in per-trial lines.
        show: Log at INFO and draw bars where a terminal allows (True), or log everything at
            DEBUG and draw nothing (False).
        interval: Minimum seconds between two DEBUG "level k" or INFO "waiting" lines with no
            change.
    """

    def __init__(self, metric_name: str, *, show: bool = True, interval: float = 15.0) -> None:
        self.metric_name = metric_name
        self.show = show
        self.level = logging.INFO if show else logging.DEBUG
        self.interval = interval
        self._last_level_line = ("", 0.0)
        self._last_wait_line = ("", 0.0)
        self._started_levels: set[int] = set()
        self._completed_levels: set[int] = set()
        self._tally: _Tally | None = None
        self._tally_level: int | None = None

    def _log(self, msg: str, *args: object) -> None:
        logger.log(self.level, msg, *args)

    def _open(self, label: str, total: int, done: int, feasible: int, unit: str = "trial") -> _Tally:
        self.close()
        tally = _Tally(label, total, done, feasible)
        tally.bar = progress_bar(
            total, label, unit=unit, enabled=self.show, initial=done, postfix=f"feasible {feasible}"
        )
        self._tally = tally
        return tally

    def close(self) -> None:
        """Close the open bar (the search ends or leaves this worker)."""
        if self._tally is not None:
            self._tally.close()
        self._tally = None
        self._tally_level = None

    def budget(self, total: int, done: int, feasible: int) -> None:
        """A rival strategy's trial budget (``max_trials``) as the unit of progress."""
        self._open("trials", total, done, feasible)
        self._log("%d of at most %d trials evaluated, %d feasible", done, total, feasible)

    def trial(self, number: int, config: Config, m: Measurement, feasible: bool | None, *, stopped: str = "") -> None:
        """One trial's line (INFO), with its level's progress; advances the bar.

        Args:
            stopped: ``"8/16"`` when the trial stopped early after 8 of 16 prompts.
        """
        verdict = "" if feasible is None else (" feasible" if feasible else " infeasible")
        if stopped:
            verdict += f", stopped after {stopped} prompts"
        tally = self._tally
        if tally is not None and self._tally_level not in (None, len(config)):
            tally = None  # a late trial of another level: no counts to show
        if tally is not None:
            tally.advance(1, int(bool(feasible)))
        self._log(
            "trial #%d level %d skip %s: accept_length=%.4f %s=%.4f cost=%.4f%s%s",
            number,
            len(config),
            _fmt(config),
            m.accept_length,
            self.metric_name,
            m.metric,
            m.cost,
            verdict,
            "" if tally is None else " " + tally.suffix(),
        )

    def state(self, state: StoredState, *, force: bool = False) -> None:
        """Log completed levels once, start the running level's bar, sync its counts."""
        plan = state.plan
        for lv in plan.levels:
            if lv.complete and lv.level not in self._completed_levels:
                self._completed_levels.add(lv.level)
                extra = ""
                if lv.level == 1 and plan.pool is not None:
                    extra = f"; candidate pool {list(plan.pool)}"
                took = ""
                if self._tally is not None and self._tally_level == lv.level:
                    self._tally.sync(lv.evaluated, len(lv.feasible))
                    took = f" ({self._tally.elapsed / 60:.1f} min)"
                    self.close()
                self._log(
                    "level %d complete: evaluated %d/%d, feasible %d%s%s",
                    lv.level,
                    lv.evaluated,
                    len(lv.configs),
                    len(lv.feasible),
                    took,
                    extra,
                )
        lv = plan.current
        if lv.complete:
            return
        if lv.level not in self._started_levels:
            self._started_levels.add(lv.level)
            n = len(lv.configs)
            joined = f", {lv.evaluated} evaluated, {len(lv.feasible)} feasible" if lv.evaluated else ""
            self._log("level %d: %d configuration%s planned%s", lv.level, n, "" if n == 1 else "s", joined)
        if self._tally_level != lv.level:
            self._open(f"level {lv.level}", len(lv.configs), lv.evaluated, len(lv.feasible))
            self._tally_level = lv.level
        elif self._tally is not None:
            self._tally.sync(lv.evaluated, len(lv.feasible))
        line = f"level {lv.level}: evaluated {lv.evaluated}/{len(lv.configs)}, feasible {len(lv.feasible)}"
        self._throttled("_last_level_line", line, force, logging.DEBUG)

    def waiting(self, state: StoredState) -> None:
        running: Sequence[FrozenTrial] = state.running
        level = state.plan.current.level
        if running:
            shown = ", ".join(f"#{t.number} {t.user_attrs.get('skip_set')}" for t in running[:8])
            more = f" (+{len(running) - 8} more)" if len(running) > 8 else ""
            line = (
                f"waiting for level {level} to finish: {len(running)} trial(s) running "
                f"elsewhere: {shown}{more}"
            )
        else:
            line = f"waiting for level {level}: its trials are being queued by another worker"
        self._throttled("_last_wait_line", line, False, self.level)

    def _throttled(self, attr: str, line: str, force: bool, level: int) -> None:
        last_line, last_time = getattr(self, attr)
        now = time.monotonic()
        changed = line != last_line and now - last_time >= self.interval
        if force or changed or now - last_time >= 4 * self.interval:
            setattr(self, attr, (line, now))
            logger.log(level, "%s", line)

    def finished(
        self,
        stop_reason: str,
        best: Config,
        pareto: list[Config],
        evaluated: int,
        given_up: list[Config] | None = None,
    ) -> None:
        self.close()
        self._log(
            "search finished (%s) after %d configurations: S* = %s; Pareto set: %s%s",
            stop_reason,
            evaluated,
            _fmt(best),
            ", ".join(_fmt(c) for c in pareto) or "-",
            (
                "; GIVEN UP after repeated worker crashes (treated as infeasible): "
                + ", ".join(_fmt(c) for c in given_up)
            )
            if given_up
            else "",
        )
