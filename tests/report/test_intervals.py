"""Paired intervals, the validation prediction and the verdict on hand-made per-prompt numbers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from report_data import VALIDATED_ENTRY

from tss_opt.report.assessment import HeldoutStats, domain_verdict, validation_prediction
from tss_opt.report.intervals import Interval, bootstrap_ratio, paired_difference
from tss_opt.search.tolerance import MetricTolerance

# Student t quantiles from tables (two-sided 90% = one-sided 95%).
T95_DF3 = 2.353363
T95_DF15 = 1.753050


def test_paired_difference_is_the_student_t_interval():
    tss, native = [2.0, 3.0, 4.0, 5.0], [1.0, 1.0, 2.0, 2.0]  # d = 1, 2, 2, 3
    iv = paired_difference(tss, native, 0.9)
    half = T95_DF3 * math.sqrt(2.0 / 3.0) / 2.0  # t * sd / sqrt(n), sd^2 = 2/3
    assert iv.estimate == pytest.approx(2.0)
    assert iv.lower == pytest.approx(2.0 - half, abs=1e-6) and iv.upper == pytest.approx(2.0 + half, abs=1e-6)
    assert (iv.level, iv.method, iv.n) == (0.9, "paired t", 4)
    assert iv.lower == pytest.approx(1.039243, abs=1e-6)


def test_paired_difference_with_16_prompts_and_other_levels():
    native = [0.5] * 16
    tss = [0.5 + (0.1 if i % 2 else -0.1) + 0.01 * i for i in range(16)]
    d = [t - n for t, n in zip(tss, native, strict=True)]
    mean = sum(d) / 16
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 15)
    iv = paired_difference(tss, native)
    assert iv.upper - iv.estimate == pytest.approx(T95_DF15 * sd / 4.0, abs=1e-6)
    wide = paired_difference(tss, native, 0.99)
    assert wide.lower < iv.lower < iv.estimate < iv.upper < wide.upper
    same = paired_difference(native, native)
    assert (same.estimate, same.lower, same.upper) == (0.0, 0.0, 0.0)


def test_one_prompt_has_no_interval_and_bad_input_is_refused():
    iv = paired_difference([2.0], [1.5])
    assert iv.estimate == 0.5 and math.isnan(iv.lower) and math.isnan(iv.upper)
    assert iv.to_dict()["lower"] is None  # JSON has no NaN
    with pytest.raises(ValueError, match="3 TSS values but 2 native"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"report_confidence=1.5 .*\(0, 1\)"):
        paired_difference([1.0, 2.0], [1.0, 2.0], 1.5)
    with pytest.raises(ValueError, match="report_bootstrap=10"):
        bootstrap_ratio([1.0, 2.0], [1.0, 2.0], resamples=10)


def test_bootstrap_ratio_is_reproducible_with_its_seed():
    rng = random.Random(7)
    native = [rng.uniform(50, 100) for _ in range(24)]
    tss = [x * rng.uniform(0.9, 1.4) for x in native]
    a = bootstrap_ratio(tss, native, 0.9, resamples=500, seed=3)
    b = bootstrap_ratio(tss, native, 0.9, resamples=500, seed=3)
    c = bootstrap_ratio(tss, native, 0.9, resamples=500, seed=4)
    assert a == b
    assert (a.lower, a.upper) != (c.lower, c.upper)
    assert a.estimate == pytest.approx(sum(tss) / sum(native))  # ratio of the means
    assert a.lower < a.estimate < a.upper
    assert (a.method, a.resamples, a.seed, a.n) == ("paired bootstrap", 500, 3, 24)
    # The same computation written out: paired resampling of prompt indices, numpy percentiles.
    r = random.Random(3)
    ratios = []
    for _ in range(500):
        idx = [r.randrange(24) for _ in range(24)]
        ratios.append(sum(tss[i] for i in idx) / sum(native[i] for i in idx))
    assert a.lower == pytest.approx(float(np.percentile(ratios, 5)), rel=1e-12)
    assert a.upper == pytest.approx(float(np.percentile(ratios, 95)), rel=1e-12)


def test_bootstrap_of_a_constant_ratio_is_that_ratio():
    native = [10.0, 20.0, 30.0, 40.0]
    iv = bootstrap_ratio([2 * x for x in native], native, resamples=200)
    assert iv.estimate == pytest.approx(2.0) and iv.lower == pytest.approx(2.0) and iv.upper == pytest.approx(2.0)


def test_validation_prediction_reads_the_entry():
    p = validation_prediction(VALIDATED_ENTRY)
    assert p is not None
    assert p.accept_change == pytest.approx(0.4) and p.accept_ratio == pytest.approx(1.2)
    assert p.metric_change == pytest.approx(-0.01)
    assert p.num_prompts == 16 and p.accept_bound["lower"] == 0.3
    assert validation_prediction({"skip_set": [2]}) is None  # not validated (older file)
    kept = {"skip_set": [], "validation": {**VALIDATED_ENTRY["validation"], "dense_kept": True, "figures": None}}
    assert validation_prediction(kept) is None
    assert validation_prediction({"validation": {**VALIDATED_ENTRY["validation"], "figures": None}}) is None


def _iv(est: float, lo: float, hi: float) -> Interval:
    return Interval(est, lo, hi, 0.9, "test", 16)


def _stats(metric=(0.0, -0.01, 0.01), speedup=(1.1, 1.0, 1.2), ratio=1.2) -> HeldoutStats:
    return HeldoutStats(
        accept_diff=_iv(0.4, 0.3, 0.5),
        accept_ratio=_iv(ratio, ratio - 0.1, ratio + 0.1),
        metric_diff=_iv(*metric),
        speedup=_iv(*speedup),
        repetition_diff=_iv(0.0, 0.0, 0.0),
    )


def test_verdict_rules():
    pred = validation_prediction(VALIDATED_ENTRY)
    v = domain_verdict(_stats(), pred, native_metric_mean=0.5)  # tolerance 0.05 * 0.5 = 0.025
    assert v.metric_tolerance == pytest.approx(0.025)
    assert v.metric_within_tolerance and v.metric_not_below and v.speedup_at_least_1 and v.goal_met
    assert v.accept_ratio_error == pytest.approx(0.0) and v.accept_within_prediction
    # The metric's interval reaches below the tolerance: not shown to hold.
    v = domain_verdict(_stats(metric=(-0.02, -0.03, -0.01)), pred, native_metric_mean=0.5)
    assert v.metric_within_tolerance is False and v.metric_not_below is False and not v.goal_met
    # A lower-is-better metric: a rise is the loss.
    v = domain_verdict(_stats(metric=(0.02, 0.01, 0.03)), pred, native_metric_mean=0.5, metric_higher_is_better=False)
    assert v.metric_within_tolerance is False
    # Absolute tolerance.
    v = domain_verdict(_stats(metric=(-0.02, -0.03, -0.01)), pred, native_metric_mean=0.5,
                       tolerance=MetricTolerance(0.05, relative=False))
    assert v.metric_tolerance == 0.05 and v.metric_within_tolerance
    # Slower than native.
    v = domain_verdict(_stats(speedup=(0.95, 0.9, 1.0)), pred, native_metric_mean=0.5)
    assert v.speedup_at_least_1 is False and not v.goal_met
    # Held-out A ratio 1.35 against a validated 1.2: 12.5% off.
    v = domain_verdict(_stats(ratio=1.35), pred, native_metric_mean=0.5)
    assert v.accept_ratio_error == pytest.approx(0.125) and v.accept_within_prediction is False and not v.goal_met
    # No validation data: that check is n/a, the rest decides.
    v = domain_verdict(_stats(ratio=1.35), None, native_metric_mean=0.5)
    assert v.accept_within_prediction is None and v.goal_met and "A as validated: n/a" in v.summary
    # Dense kept.
    v = domain_verdict(None, None, native_metric_mean=0.5, dense_kept_reason="no candidate passed validation")
    assert v.dense_kept and v.goal_met and v.summary == "dense kept (no candidate passed validation)"
