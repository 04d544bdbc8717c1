"""Two-sided confidence intervals paired over prompts, for the held-out report.

Both methods (native and TSS) run the same held-out prompts, so every quantity is compared
prompt by prompt:

- **Mean paired difference** (accepted length, metric, repetition):
  ``d_i = x_i(TSS) - x_i(native)``; the two-sided ``level`` interval is
  ``mean(d) -/+ t_{(1 + level) / 2, n - 1} * stdev(d) / sqrt(n)`` (Student t, sample standard
  deviation with n - 1). For ``level = 0.9`` that is ``t_{0.95, n-1}``: each end is a one-sided
  95% bound. Computed with :func:`tss_opt.search.feasibility.paired_bound`, the search's own
  statistics, so the report and the search agree on the arithmetic. Deterministic.
- **Ratio of means** (speedup = mean tokens/s of TSS over mean tokens/s of native; accepted
  length ratio): a **paired percentile bootstrap** over prompts. Each of ``resamples``
  resamples draws n prompt indices with replacement (``random.Random(seed)``, so the same
  seed gives the same interval), takes both methods' values *of the same prompts* and
  computes the ratio of their means; the interval is the ``(1 - level) / 2`` and
  ``(1 + level) / 2`` quantiles of those ratios (``numpy.quantile``, linear interpolation).
  The estimate is the ratio on the full sample. A ratio has no Student-t form and tokens/s
  of a prompt is skewed, which is why it is resampled rather than approximated.

  Why not ``scipy.stats.bootstrap(..., paired=True, method="percentile")``: its percentile
  method is the same (numpy's linear quantiles of the resampled statistic), but it draws
  the resampled indices from a numpy ``Generator``, not from ``random.Random(seed)``, so the
  same seed gives other resamples: on 48 synthetic prompts with 2000 resamples the ends
  moved by about 1e-3 (1.29457/1.41946 here against 1.29594/1.41911), enough to change the
  committed reports (docs/results/heldout.*, seed 0) at their last digit. The resampling
  stays ours; the quantiles are numpy's.

With fewer than 2 prompts no interval exists: the ends are NaN (shown as "n/a").

Nothing here imports torch or Optuna.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tss_opt.config.schema import REPORT_LEVEL, REPORT_RESAMPLES
from tss_opt.search.feasibility import paired_bound

__all__ = ["Interval", "bootstrap_ratio", "check_level", "paired_difference"]

NAN = float("nan")


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided interval.

    Attributes:
        estimate: Mean paired difference, or ratio of means.
        lower, upper: The interval's ends (NaN with fewer than 2 prompts).
        level: Two-sided coverage (0.9: a 90% interval).
        method: ``"paired t"`` or ``"paired bootstrap"``.
        n: Prompts.
        resamples, seed: The bootstrap's (``None`` for t).
    """

    estimate: float
    lower: float
    upper: float
    level: float
    method: str
    n: int
    resamples: int | None = None
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "estimate": _clean(self.estimate),
            "lower": _clean(self.lower),
            "upper": _clean(self.upper),
            "level": self.level,
            "method": self.method,
            "n": self.n,
        }
        if self.resamples is not None:
            out["resamples"] = self.resamples
            out["seed"] = self.seed
        return out


def _clean(x: float) -> float | None:
    # JSON has no NaN: missing ends are written as null.
    return None if math.isnan(x) else x


def check_level(level: float) -> float:
    """``level`` if it is a valid two-sided coverage, else a ValueError naming it."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.0 < level < 1.0:
        raise ValueError(f"report_confidence={level!r} is out of range; expected a two-sided level in (0, 1), e.g. 0.9")
    return float(level)


def _pair(tss: Sequence[float], native: Sequence[float]) -> tuple[list[float], list[float]]:
    if len(tss) != len(native):
        raise ValueError(
            f"paired values need the same prompts: {len(tss)} TSS values but {len(native)} native ones"
        )
    if not tss:
        raise ValueError("no per-prompt values to compare; run at least one held-out prompt")
    return [float(x) for x in tss], [float(x) for x in native]


def paired_difference(tss: Sequence[float], native: Sequence[float], level: float = REPORT_LEVEL) -> Interval:
    """Mean of ``tss_i - native_i`` with its two-sided Student-t interval (module docstring)."""
    a, b = _pair(tss, native)
    level = check_level(level)
    n = len(a)
    if n < 2:
        return Interval(a[0] - b[0], NAN, NAN, level, "paired t", n)
    # A two-sided interval at `level` is two one-sided bounds at (1 + level) / 2.
    mean, lo, hi = paired_bound(a, b, (1.0 + level) / 2.0)
    return Interval(mean, lo, hi, level, "paired t", n)


def _ratio(a: Sequence[float], b: Sequence[float]) -> float:
    den = math.fsum(b)
    return math.fsum(a) / den if den > 0 else NAN


def bootstrap_ratio(
    tss: Sequence[float],
    native: Sequence[float],
    level: float = REPORT_LEVEL,
    *,
    resamples: int = REPORT_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """``mean(tss) / mean(native)`` with a seeded paired percentile bootstrap interval.

    Args:
        tss, native: Per-prompt values of the same prompts, in the same order.
        level: Two-sided coverage.
        resamples: Bootstrap resamples (>= 100).
        seed: Seed of the resampling; the same seed gives the same interval.

    Raises:
        ValueError: Different lengths, no values, ``level`` outside (0, 1), ``resamples`` < 100.
    """
    a, b = _pair(tss, native)
    level = check_level(level)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"report_bootstrap={resamples!r} is too small; expected an integer >= 100 (default {REPORT_RESAMPLES})")
    n = len(a)
    est = _ratio(a, b)
    if n < 2:
        return Interval(est, NAN, NAN, level, "paired bootstrap", n, resamples, seed)
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        r = _ratio([a[i] for i in idx], [b[i] for i in idx])
        if not math.isnan(r):
            ratios.append(r)
    if not ratios:
        return Interval(est, NAN, NAN, level, "paired bootstrap", n, resamples, seed)
    alpha = (1.0 - level) / 2.0
    lower, upper = np.quantile(ratios, [alpha, 1.0 - alpha])
    return Interval(est, float(lower), float(upper), level, "paired bootstrap", n, resamples, seed)
