"""The metric tolerance ``delta_M``: how much mean metric loss a skip set may show against dense.

One function, used wherever a metric is judged against native (dense):

- the search's feasibility and candidate pool (:func:`tss_opt.search.algorithm.thresholds_for`
  for the point rule, :meth:`tss_opt.search.feasibility.PairedFeasibility.build` for the paired
  rule, hence early and futility stopping too);
- validation before the mapping (:func:`tss_opt.search.validation.validate_candidates`, the
  paired rule on the validation split);
- the held-out report's verdict (:func:`tss_opt.report.assessment.domain_verdict`);
- ``tune_verification``'s paired metric rule (:func:`tss_opt.training.relaxed.check_against_dense`).

Rule (issue 36)::

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

from tss_opt.config.search import DEFAULT_EPS_METRIC_ABS

__all__ = ["DEFAULT_EPS_METRIC_ABS", "metric_tolerance"]


def metric_tolerance(
    eps: float, native: float, *, relative: bool, floor: float = DEFAULT_EPS_METRIC_ABS
) -> float:
    """The allowed mean metric loss against native (module docstring).

    Args:
        eps: ``eps_metric`` (or ``tau_metric`` for the candidate pool): a fraction of native's
            mean metric when ``relative``, else an absolute loss.
        native: Native's (dense's) mean metric on the same prompts.
        relative: ``SearchSettings.relative``.
        floor: ``SearchSettings.eps_metric_abs``, the absolute floor of a positive relative
            tolerance (``>= 0``; 0 disables it).

    Returns:
        ``delta_M`` (``>= 0`` unless ``eps < 0`` requires a gain).

    Raises:
        ValueError: ``floor`` is negative or not finite, or ``native`` is not finite.

    Example:
        >>> metric_tolerance(0.05, 0.3, relative=True)  # the paper's 5 %: the floor is below it
        0.015
        >>> metric_tolerance(0.05, 0.0, relative=True)  # native scores 0: the floor
        0.005
    """
    if not math.isfinite(floor) or floor < 0:
        raise ValueError(f"eps_metric_abs={floor!r} must be a finite number >= 0 (e.g. 0.005; 0 disables the floor)")
    if not math.isfinite(native):
        raise ValueError(f"native's mean metric is {native!r}; a tolerance needs a finite number")
    if not relative:
        return eps
    delta = eps * abs(native)
    return max(delta, floor) if eps > 0 else delta
