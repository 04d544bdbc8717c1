"""Progress reporting of a search through ``logging`` (logger ``tss_opt.search``).

Lines a worker logs:

- per trial: ``trial #12 level 2 skip [3, 7]: accept_length=2.9100 f1=0.1310 cost=0.8200 feasible``
- per level, when it completes and at most every ``interval`` seconds while it runs:
  ``level 2: evaluated 14/21, feasible 5``
- while waiting: ``waiting for level 2 to finish: 3 trial(s) running elsewhere: #14 [1, 3], ...``
- at the end: the stop reason, S* and the Pareto set.

With ``show_progress=False`` the same lines go out at DEBUG level.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from optuna.trial import FrozenTrial

from tss_opt.search.algorithm import Config, Measurement, canonical
from tss_opt.search.sampler import StoredState

__all__ = ["Progress", "logger"]

logger = logging.getLogger("tss_opt.search")


def _fmt(config: Config) -> str:
    return str(list(canonical(config)))


class Progress:
    """Throttled progress lines for one worker.

    Args:
        metric_name: The metric's name, used in per-trial lines.
        show: Log at INFO (True) or DEBUG (False).
        interval: Minimum seconds between two "level k" or "waiting" lines with no change.
    """

    def __init__(self, metric_name: str, *, show: bool = True, interval: float = 15.0) -> None:
        self.metric_name = metric_name
        self.level = logging.INFO if show else logging.DEBUG
        self.interval = interval
        self._last_level_line = ("", 0.0)
        self._last_wait_line = ("", 0.0)
        self._completed_levels: set[int] = set()

    def _log(self, msg: str, *args: object) -> None:
        logger.log(self.level, msg, *args)

    def trial(self, number: int, config: Config, m: Measurement, feasible: bool | None) -> None:
        verdict = "" if feasible is None else (" feasible" if feasible else " infeasible")
        self._log(
            "trial #%d level %d skip %s: accept_length=%.4f %s=%.4f cost=%.4f%s",
            number,
            len(config),
            _fmt(config),
            m.accept_length,
            self.metric_name,
            m.metric,
            m.cost,
            verdict,
        )

    def state(self, state: StoredState, *, force: bool = False) -> None:
        """Log completed levels once and the running level's counts (throttled)."""
        plan = state.plan
        for lv in plan.levels:
            if lv.complete and lv.level not in self._completed_levels:
                self._completed_levels.add(lv.level)
                extra = ""
                if lv.level == 1 and plan.pool is not None:
                    extra = f"; candidate pool {list(plan.pool)}"
                self._log(
                    "level %d complete: evaluated %d/%d, feasible %d%s",
                    lv.level,
                    lv.evaluated,
                    len(lv.configs),
                    len(lv.feasible),
                    extra,
                )
        lv = plan.current
        if not lv.complete:
            line = f"level {lv.level}: evaluated {lv.evaluated}/{len(lv.configs)}, feasible {len(lv.feasible)}"
            self._throttled("_last_level_line", line, force)

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
        self._throttled("_last_wait_line", line, False)

    def _throttled(self, attr: str, line: str, force: bool) -> None:
        last_line, last_time = getattr(self, attr)
        now = time.monotonic()
        changed = line != last_line and now - last_time >= self.interval
        if force or changed or now - last_time >= 4 * self.interval:
            setattr(self, attr, (line, now))
            self._log("%s", line)

    def finished(
        self,
        stop_reason: str,
        best: Config,
        pareto: list[Config],
        evaluated: int,
        given_up: list[Config] | None = None,
    ) -> None:
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
