"""Judging one domain's held-out result: intervals, the validation prediction, the verdict.

The goal on held-out prompts, per domain, as computed here:

- **Metric not significantly below native** (non-inferiority): the lower end of the two-sided
  ``level`` (0.9) interval of the mean paired metric difference (oriented so that negative
  is worse) is ``>= -tolerance``, with ``tolerance = max(eps_metric * |native's mean
  per-prompt metric|, eps_metric_abs)`` (``relative=True``, the search's default) or
  ``eps_metric``: the search's own rule, :class:`tss_opt.search.tolerance.MetricTolerance`
  (so a domain where native scores 0 is not held to a zero tolerance). This is the
  search's own promise ("kept quality within eps") checked on unseen prompts at one-sided
  95%. The weaker literal reading, "the interval reaches 0" (upper end >= 0: no significant
  loss at all), is reported beside it as ``metric_not_below``.
- **Speedup >= 1.0x**: the point estimate (ratio of mean tokens/s, TSS over native) is at
  least 1; ``speedup_significant`` says whether the interval's lower end is too.
- **Accepted length as validated**: the held-out ratio ``A(S*)/A(dense)`` (ratio of per-prompt
  means) lies within 10% (relative) of the ratio measured on the validation split:
  ``|ratio_heldout / ratio_validation - 1| <= 0.10``. Ratios rather than raw changes, because
  a change near zero (a dense-like set) would make any relative error of the change explode;
  the raw changes are reported too.
- **Dense kept** (empty S*): native is measured once, no comparison is made; the verdict is
  met by construction (running dense is the correct answer when nothing passed validation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tss_opt.config.objectives import ACCEPT_LENGTH
from tss_opt.config.schema import REPORT_LEVEL, REPORT_RESAMPLES
from tss_opt.report.intervals import Interval, bootstrap_ratio, paired_difference
from tss_opt.search.tolerance import DEFAULT_TOLERANCE, MetricTolerance

if TYPE_CHECKING:
    from tss_opt.evaluation.evaluator import EvalResult

__all__ = [
    "PREDICTION_TOLERANCE",
    "DomainVerdict",
    "HeldoutStats",
    "ValidationPrediction",
    "domain_verdict",
    "heldout_stats",
    "validation_prediction",
]

# Relative agreement required between held-out and validated accepted-length ratios.
PREDICTION_TOLERANCE = 0.10


@dataclass(frozen=True)
class HeldoutStats:
    """Native vs TSS on the held-out prompts, paired over prompts.

    Attributes:
        accept_diff: Mean per-prompt accepted-length difference, TSS - native (t interval).
        accept_ratio: Mean per-prompt accepted length of TSS over native's (bootstrap).
        metric_diff: Mean per-prompt metric difference, TSS - native (t interval; raw, not
            oriented by the metric's direction).
        speedup: Mean tokens/s of TSS over native's (bootstrap).
        repetition_diff: Mean per-prompt repeated-4-gram share difference (t interval).
    """

    accept_diff: Interval
    accept_ratio: Interval
    metric_diff: Interval
    speedup: Interval
    repetition_diff: Interval

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k).to_dict() for k in self.__dataclass_fields__}


def heldout_stats(
    native: EvalResult,
    tss: EvalResult,
    *,
    level: float = REPORT_LEVEL,
    resamples: int = REPORT_RESAMPLES,
    seed: int = 0,
) -> HeldoutStats:
    """The paired intervals of :class:`HeldoutStats` from both results' per-prompt records.

    Raises:
        ValueError: The results do not cover the same prompts in the same order.
    """
    ids_n, ids_t = [p.id for p in native.prompts], [p.id for p in tss.prompts]
    if ids_n != ids_t:
        raise ValueError(f"native and TSS ran different prompts ({ids_n} vs {ids_t}); they must be paired")

    def col(res: EvalResult, name: str) -> list[float]:
        return [float(getattr(p, name)) for p in res.prompts]

    return HeldoutStats(
        accept_diff=paired_difference(col(tss, ACCEPT_LENGTH), col(native, ACCEPT_LENGTH), level),
        accept_ratio=bootstrap_ratio(
            col(tss, ACCEPT_LENGTH), col(native, ACCEPT_LENGTH), level, resamples=resamples, seed=seed
        ),
        metric_diff=paired_difference(col(tss, "score"), col(native, "score"), level),
        speedup=bootstrap_ratio(col(tss, "tokens_per_s"), col(native, "tokens_per_s"), level, resamples=resamples, seed=seed),
        repetition_diff=paired_difference(col(tss, "repetition"), col(native, "repetition"), level),
    )


@dataclass(frozen=True)
class ValidationPrediction:
    """What validation measured for the chosen set (the mapping entry's ``validation``).

    Attributes:
        num_prompts: Validation prompts.
        confidence: The validation rule's one-sided confidence.
        dense_accept, accept: Mean per-prompt accepted length of dense and of S*.
        dense_metric, metric: Mean per-prompt metric of dense and of S*.
        accept_bound, metric_bound: The paired bounds (``mean_diff``, ``lower``, ``upper``,
            ``tolerance``, ``n``; one-sided at ``confidence``), if recorded.
    """

    num_prompts: int
    confidence: float
    dense_accept: float
    accept: float
    dense_metric: float
    metric: float
    accept_bound: Mapping[str, Any] | None = None
    metric_bound: Mapping[str, Any] | None = None

    @property
    def accept_change(self) -> float:
        return self.accept - self.dense_accept

    @property
    def accept_ratio(self) -> float:
        return self.accept / self.dense_accept if self.dense_accept > 0 else math.nan

    @property
    def metric_change(self) -> float:
        return self.metric - self.dense_metric

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_prompts": self.num_prompts,
            "confidence": self.confidence,
            "dense_accept_length": self.dense_accept,
            ACCEPT_LENGTH: self.accept,
            "accept_length_change": self.accept_change,
            "accept_length_ratio": None if math.isnan(self.accept_ratio) else self.accept_ratio,
            "accept_length_bound": dict(self.accept_bound) if self.accept_bound else None,
            "dense_metric": self.dense_metric,
            "metric": self.metric,
            "metric_change": self.metric_change,
            "metric_bound": dict(self.metric_bound) if self.metric_bound else None,
        }


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def validation_prediction(entry: Mapping[str, Any]) -> ValidationPrediction | None:
    """The validated figures of a mapping entry (its JSON form), or ``None`` when the entry
    was not validated, kept dense, or lacks the figures (older mapping files)."""
    val = entry.get("validation")
    if not isinstance(val, Mapping) or val.get("dense_kept"):
        return None
    figs, dense = val.get("figures"), val.get("dense")
    if not isinstance(figs, Mapping) or not isinstance(dense, Mapping):
        return None
    nums = [_num(dense.get(ACCEPT_LENGTH)), _num(figs.get(ACCEPT_LENGTH)),
            _num(dense.get("metric")), _num(figs.get("metric"))]
    if any(x is None for x in nums):
        return None
    bounds = figs.get("bounds") if isinstance(figs.get("bounds"), Mapping) else {}
    return ValidationPrediction(
        num_prompts=int(val.get("num_prompts") or dense.get("n") or 0),
        confidence=float(val.get("confidence") or 0.0),
        dense_accept=nums[0],  # type: ignore[arg-type]
        accept=nums[1],  # type: ignore[arg-type]
        dense_metric=nums[2],  # type: ignore[arg-type]
        metric=nums[3],  # type: ignore[arg-type]
        accept_bound=bounds.get(ACCEPT_LENGTH),
        metric_bound=bounds.get("metric"),
    )


@dataclass(frozen=True)
class DomainVerdict:
    """The issue's goal for one domain (module docstring); ``None`` = not applicable.

    Attributes:
        dense_kept: S* is empty: nothing to compare, the goal holds by construction.
        metric_tolerance: The allowed mean metric loss (absolute).
        metric_within_tolerance: Lower end of the oriented metric-difference interval >= -tol.
        metric_not_below: Upper end of the oriented interval >= 0 (no significant loss).
        speedup_at_least_1: Point speedup >= 1.0.
        speedup_significant: Lower end of the speedup interval >= 1.0.
        accept_ratio_error: ``ratio_heldout / ratio_validation - 1``.
        accept_within_prediction: ``|accept_ratio_error| <= 0.10`` (``None``: no validation data).
        goal_met: Metric within tolerance, speedup >= 1, and (if known) A as validated.
        summary: One line for the table.
    """

    dense_kept: bool
    metric_tolerance: float | None = None
    metric_within_tolerance: bool | None = None
    metric_not_below: bool | None = None
    speedup_at_least_1: bool | None = None
    speedup_significant: bool | None = None
    accept_ratio_error: float | None = None
    accept_within_prediction: bool | None = None
    goal_met: bool = True
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def domain_verdict(
    stats: HeldoutStats | None,
    prediction: ValidationPrediction | None,
    *,
    native_metric_mean: float,
    tolerance: MetricTolerance = DEFAULT_TOLERANCE,
    metric_higher_is_better: bool = True,
    dense_kept_reason: str | None = None,
) -> DomainVerdict:
    """Judge one domain (see the module docstring); ``stats=None`` means dense kept;
    ``tolerance``: the search's metric tolerance."""
    if stats is None:
        return DomainVerdict(dense_kept=True, goal_met=True, summary=f"dense kept ({dense_kept_reason or 'empty skip set'})")
    tol = tolerance.delta(native_metric_mean)
    d = stats.metric_diff
    # Orient so that negative is worse whatever the metric's direction.
    lo, hi = (d.lower, d.upper) if metric_higher_is_better else (-d.upper, -d.lower)
    within = None if math.isnan(lo) else lo >= -tol
    not_below = None if math.isnan(hi) else hi >= 0.0
    sp = stats.speedup
    fast = None if math.isnan(sp.estimate) else sp.estimate >= 1.0
    fast_sig = None if math.isnan(sp.lower) else sp.lower >= 1.0
    err = within_pred = None
    if prediction is not None and not math.isnan(prediction.accept_ratio) and not math.isnan(stats.accept_ratio.estimate):
        err = stats.accept_ratio.estimate / prediction.accept_ratio - 1.0
        within_pred = abs(err) <= PREDICTION_TOLERANCE
    goal = bool(within) and bool(fast) and within_pred is not False

    def mark(ok: bool | None) -> str:
        return "n/a" if ok is None else ("yes" if ok else "NO")

    parts = [
        f"metric within tol: {mark(within)}",
        f"speedup >= 1: {mark(fast)}",
        f"A as validated: {mark(within_pred)}",
    ]
    return DomainVerdict(
        dense_kept=False,
        metric_tolerance=tol,
        metric_within_tolerance=within,
        metric_not_below=not_below,
        speedup_at_least_1=fast,
        speedup_significant=fast_sig,
        accept_ratio_error=err,
        accept_within_prediction=within_pred,
        goal_met=goal,
        summary=("goal met" if goal else "goal missed") + " (" + "; ".join(parts) + ")",
    )
