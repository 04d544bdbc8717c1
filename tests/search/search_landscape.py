"""Synthetic evaluators for the search tests: deterministic, non-additive objectives.

``Landscape(seed)`` draws per-layer effects and random pairwise interactions (so the effect
of skipping two layers is not the sum of their single effects) plus a size penalty. The
dense run gives A0 = 3, M0 = 0.5 (or a lower-is-better metric around 10), C0 = 1.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class Landscape:
    """An evaluator over ``num_layers`` layers (see the module docstring).

    Args:
        num_layers: L.
        seed: Draws the coefficients.
        sleep: Seconds each call sleeps (to let workers overlap).
        log_path: Each call appends ``start <layers>`` before and ``done <layers>`` after.
        metric_higher_is_better: False gives a perplexity-like metric (lower is better).
        kill_on: Skip sets on which the process SIGKILLs itself mid-evaluation, once per
            set (a marker file next to ``log_path`` remembers it happened).
        interrupt_after: Raise KeyboardInterrupt at this call number (1-based).
    """

    metric_name = "f1"

    def __init__(
        self,
        num_layers: int = 8,
        seed: int = 0,
        *,
        sleep: float = 0.0,
        log_path: str | os.PathLike[str] | None = None,
        metric_higher_is_better: bool = True,
        kill_on: Iterable[Iterable[int]] = (),
        interrupt_after: int | None = None,
    ) -> None:
        self.num_layers = num_layers
        self.seed = seed
        self.sleep = sleep
        self.log_path = Path(log_path) if log_path else None
        self.metric_higher_is_better = metric_higher_is_better
        if not metric_higher_is_better:
            self.metric_name = "ppl"
        self.kill_on = {frozenset(k) for k in kill_on}
        self.interrupt_after = interrupt_after
        self.calls = 0
        self.seen: list[frozenset[int]] = []
        rng = random.Random(seed)
        self.a = [rng.uniform(-0.30, 0.16) for _ in range(num_layers)]
        self.m = [rng.uniform(-0.07, 0.035) for _ in range(num_layers)]
        self.c = [rng.uniform(0.02, 0.06) for _ in range(num_layers)]
        self.pairs: dict[frozenset[int], tuple[float, float]] = {}
        for i, j in itertools.combinations(range(num_layers), 2):
            if rng.random() < 0.3:
                self.pairs[frozenset((i, j))] = (rng.uniform(-0.25, 0.3), rng.uniform(-0.05, 0.06))

    def measure(self, skip: frozenset[int]) -> dict[str, Any]:
        """The objectives of ``skip`` (pure; no sleeping or logging)."""
        k = len(skip)
        a = 3.0 + sum(self.a[i] for i in skip) - 0.02 * k * (k - 1)
        m = 0.5 + sum(self.m[i] for i in skip) - 0.004 * k * (k - 1)
        for pair, (da, dm) in self.pairs.items():
            if pair <= skip:
                a += da
                m += dm
        cost = 1.0
        for i in skip:
            cost *= 1.0 - self.c[i]
        cost += 0.001 * k * k
        if not self.metric_higher_is_better:
            m = 10.0 + 20.0 * (0.5 - m)
        return {
            "accept_length": a,
            "metric": m,
            "cost": cost,
            "tokens_per_s": 100.0 * a / cost,
            "cost_analytic": 1.0 - k / self.num_layers,
            "metric_extras": {"em": round(m, 3), "layers": sorted(skip)},
        }

    def _log(self, what: str, skip: frozenset[int]) -> None:
        if self.log_path is None:
            return
        with open(self.log_path, "a") as f:
            f.write(f"{what} {','.join(map(str, sorted(skip)))}\n")
            f.flush()
            os.fsync(f.fileno())

    def __call__(self, skip: frozenset[int]) -> dict[str, Any]:
        self.calls += 1
        self._log("start", skip)
        if self.interrupt_after is not None and self.calls == self.interrupt_after:
            raise KeyboardInterrupt
        if skip in self.kill_on and self.log_path is not None:
            marker = self.log_path.with_name(
                "killed-" + "_".join(map(str, sorted(skip))) + ".marker"
            )
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                time.sleep(self.sleep / 2)
                os.kill(os.getpid(), 9)
        if self.sleep:
            time.sleep(self.sleep)
        result = self.measure(skip)
        self.seen.append(skip)
        self._log("done", skip)
        return result


def read_log(path: str | os.PathLike[str]) -> list[tuple[str, frozenset[int]]]:
    """Parse a ``Landscape`` log into ``(what, skip set)`` lines."""
    out = []
    for line in Path(path).read_text().splitlines():
        what, _, layers = line.partition(" ")
        out.append((what, frozenset(int(x) for x in layers.split(",") if x)))
    return out


class GroupLandscape(Landscape):
    """A :class:`Landscape` that evaluates several skip sets per call (grouped trials):
    ``call_group`` logs a ``start`` line for every set, sleeps once for the group (one batch)
    and logs ``done`` for every set; a set in ``kill_on`` kills the process once, mid-group."""

    supports_groups = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups: list[list[frozenset[int]]] = []

    def call_group(self, skips: list[frozenset[int]], prompt_ids: Any = None) -> list[dict[str, Any]]:
        sets = [frozenset(s) for s in skips]
        self.groups.append(sets)
        for s in sets:
            self.calls += 1
            self._log("start", s)
            if self.interrupt_after is not None and self.calls == self.interrupt_after:
                raise KeyboardInterrupt
        for s in sets:
            if s in self.kill_on and self.log_path is not None:
                marker = self.log_path.with_name("killed-" + "_".join(map(str, sorted(s))) + ".marker")
                if not marker.exists():
                    marker.write_text(str(os.getpid()))
                    os.kill(os.getpid(), 9)
        if self.sleep:
            time.sleep(self.sleep)
        out = []
        for s in sets:
            out.append(self.measure(s))
            self.seen.append(s)
            self._log("done", s)
        return out
