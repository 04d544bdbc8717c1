"""The metric tolerance ``delta_M``: how much mean metric loss a skip set may show against dense.

One value, :class:`MetricTolerance` (the search's ``eps_metric``, ``relative`` and
``eps_metric_abs``), used wherever a metric is judged against native (dense):

- the search's feasibility and candidate pool (:func:`tss_opt.search.algorithm.thresholds_for`
  for the point rule, :meth:`tss_opt.search.feasibility.PairedFeasibility.build` for the paired
  rule, hence early and futility stopping too);
- validation before the mapping (:func:`tss_opt.search.validation.validate_candidates`, the
  paired rule on the validation split);
- the held-out report's verdict (:func:`tss_opt.report.assessment.domain_verdict`);
- ``tune_verification``'s paired metric rule (:func:`tss_opt.training.relaxed.check_against_dense`).

Rule::

    relative and eps > 0:  delta_M = max(eps * |native|, eps_metric_abs)
    relative and eps <= 0: delta_M = eps * |native|        (no loss allowed, or a gain required)
    not relative:          delta_M = eps                   (already absolute)

Why the floor: a relative tolerance vanishes with native's metric. A small model that scores
0 on a task (grade-school math: every answer wrong) gets ``delta_M = 0``, and a skip set whose
mean metric *rose* still fails, because a t-bound on a handful of prompts always reaches
below 0 when its outputs differ at all. The floor is in the metric's own units, so it is meant
for metrics bounded on [0, 1] (every built-in metric: accuracy, token F1, ROUGE-L, BLEU,
exact/numeric match): :data:`~tss_opt.config.search.DEFAULT_EPS_METRIC_ABS` = 0.005 is half a
point on that scale. It binds only where ``eps * |native| < 0.005``, i.e. at the default
``eps = 0.05`` where native's mean metric is below 0.1; above that the rule is the paper's.
Scale it (or set 0) for a metric on another range. It never turns a zero or negative ``eps``
(the tolerance sweep's "no loss" and "gain required" rows) into an allowed loss.

Accepted length has no floor: it is at least 1, so ``eps * A0 >= eps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tss_opt.config.search import DEFAULT_EPS_METRIC_ABS, SearchSettings

__all__ = ["DEFAULT_EPS_METRIC_ABS", "DEFAULT_TOLERANCE", "MetricTolerance"]


@dataclass(frozen=True)
class MetricTolerance:
    """The metric tolerance rule (module docstring) as one value.

    Attributes:
        eps: ``eps_metric`` (or ``tau_metric`` for the candidate pool): a fraction of native's
            mean metric when ``relative``, else an absolute loss.
        relative: ``SearchSettings.relative``.
        floor: ``SearchSettings.eps_metric_abs``, the absolute floor of a positive relative
            tolerance (``>= 0``; 0 disables it).

    Raises:
        ValueError: ``floor`` is negative or not finite.

    Example:
        >>> MetricTolerance(0.05).delta(0.3)  # the paper's 5 %: the floor is below it
        0.015
        >>> MetricTolerance(0.05).delta(0.0)  # native scores 0: the floor
        0.005
    """

    eps: float = 0.05
    relative: bool = True
    floor: float = DEFAULT_EPS_METRIC_ABS

    def __post_init__(self) -> None:
        if not math.isfinite(self.floor) or self.floor < 0:
            raise ValueError(
                f"eps_metric_abs={self.floor!r} must be a finite number >= 0 (e.g. 0.005; 0 disables the floor)"
            )

    @classmethod
    def of(cls, settings: SearchSettings, *, pool: bool = False) -> MetricTolerance:
        """The search's feasibility tolerance (``eps_metric``) or, with ``pool``, its candidate
        pool's (``tau_metric``), under the settings' ``relative`` and ``eps_metric_abs``."""
        eps = settings.tau_metric if pool else settings.eps_metric
        return cls(float(eps), bool(settings.relative), float(settings.eps_metric_abs))

    def delta(self, native: float) -> float:
        """The allowed mean metric loss against native's mean metric ``native`` (``>= 0``
        unless ``eps < 0`` requires a gain).

        Raises:
            ValueError: ``native`` is not finite.
        """
        if not math.isfinite(native):
            raise ValueError(f"native's mean metric is {native!r}; a tolerance needs a finite number")
        if not self.relative:
            return self.eps
        delta = self.eps * abs(native)
        return max(delta, self.floor) if self.eps > 0 else delta

    def to_dict(self) -> dict[str, Any]:
        """The settings under their configuration names (``search.eps_metric``, ...)."""
        return {"eps_metric": self.eps, "relative": self.relative, "eps_metric_abs": self.floor}


DEFAULT_TOLERANCE = MetricTolerance()
"""The search's default: 5 % of native's mean metric, at least 0.005."""
