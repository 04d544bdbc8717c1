"""The metric tolerance's floor: one rule (one value) for the search, validation and the report.

A domain where dense scores 0 on every prompt (a small model that fails the task) held the
metric to a tolerance of 0: a skip set whose metric *rose* on one prompt still failed, since a
t-bound on 16 prompts reaches below 0 as soon as outputs differ. With the floor
(``eps_metric_abs``, default 0.005) the same set passes all three checks; without it
(``eps_metric_abs=0``, the rule before) it fails all three.
"""

from __future__ import annotations

from typing import Any

import pytest

from tss_opt.config import SearchSettings
from tss_opt.config.search import DEFAULT_EPS_METRIC_ABS, SearchSettingsError
from tss_opt.evaluation.evaluator import EvalResult, PromptRecord
from tss_opt.report.assessment import domain_verdict, heldout_stats
from tss_opt.search import run_search, validate_candidates
from tss_opt.search.algorithm import Measurement, thresholds_for
from tss_opt.search.tolerance import MetricTolerance

N = 16
GAIN = 0.1  # the one prompt whose score rises under the cheapest skip set


@pytest.mark.parametrize(
    ("eps", "native", "relative", "floor", "expected"),
    [
        (0.05, 0.3, True, 0.005, 0.015),  # the paper's 5 %: above the floor, unchanged
        (0.05, 0.0, True, 0.005, 0.005),  # dense scores 0: the floor
        (0.05, 0.0345, True, 0.005, 0.005),  # qa's dense F1: 5 % is 0.0017, the floor binds
        (0.05, -0.2, True, 0.005, 0.01),  # |native|
        (0.05, 0.0, True, 0.0, 0.0),  # no floor: the rule before the floor existed
        (0.0, 0.0, True, 0.005, 0.0),  # eps = 0 asks for no loss: the floor does not apply
        (-0.05, 0.2, True, 0.005, -0.01),  # a required gain stays required
        (0.02, 0.0, False, 0.005, 0.02),  # absolute tolerances are used as given
    ],
)
def test_metric_tolerance(eps, native, relative, floor, expected):
    assert MetricTolerance(eps, relative, floor).delta(native) == pytest.approx(expected)


def test_the_tolerance_is_read_from_the_search_settings_once():
    s = SearchSettings(eps_metric=0.1, tau_metric=0.2, relative=True, eps_metric_abs=0.01)
    assert MetricTolerance.of(s) == MetricTolerance(0.1, True, 0.01)
    assert MetricTolerance.of(s, pool=True) == MetricTolerance(0.2, True, 0.01)
    assert MetricTolerance.of(s).to_dict() == {"eps_metric": 0.1, "relative": True, "eps_metric_abs": 0.01}


def test_bad_floors_are_refused_with_the_fix():
    with pytest.raises(SearchSettingsError, match=r"eps_metric_abs=-0.01 is out of range; expected 0 <= eps_metric_abs < 1"):
        SearchSettings(eps_metric_abs=-0.01)
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        MetricTolerance(0.05, True, float("nan"))


def test_the_floor_is_part_of_the_study_identity_only_when_set():
    assert SearchSettings().identity()["eps_metric_abs"] == DEFAULT_EPS_METRIC_ABS == 0.005
    # Off, the identity (and the study name) is the one of studies made before the floor.
    assert "eps_metric_abs" not in SearchSettings(eps_metric_abs=0.0).identity()


def test_the_point_rule_uses_the_same_floor():
    base = Measurement(accept_length=2.0, metric=0.0, cost=1.0)
    assert thresholds_for(base, SearchSettings()).metric == pytest.approx(-0.005)
    assert thresholds_for(base, SearchSettings(eps_metric_abs=0.0)).metric == 0.0
    assert thresholds_for(base, SearchSettings(eps_metric_abs=0.0)).accept == pytest.approx(1.9)


def _score(skip: frozenset[int], i: int) -> float:
    return GAIN if skip == frozenset({1}) and i == 5 else 0.0


class ZeroScores:
    """Dense scores 0 on all 16 prompts; every skip set keeps each prompt's accepted length and
    score, except {1} (the cheapest), whose score rises to 0.1 on prompt 5."""

    num_layers = 4
    num_prompts = N
    metric_name = "token_f1"

    def __call__(self, skip: frozenset[int], prompt_ids: Any = None) -> dict[str, Any]:
        skip = frozenset(skip)
        ids = range(N) if prompt_ids is None else prompt_ids
        rows = [{"accept_length": 2.0 + 0.1 * (i % 3), "metric": _score(skip, i)} for i in ids]
        return {
            "accept_length": sum(r["accept_length"] for r in rows) / len(rows),
            "metric": sum(r["metric"] for r in rows) / len(rows),
            "cost": 1.0 - 0.1 * len(skip) - (0.05 if 1 in skip else 0.0),
            "per_prompt": rows,
        }


@pytest.mark.parametrize(("floor", "best"), [(DEFAULT_EPS_METRIC_ABS, [1]), (0.0, [0])])
def test_search_feasibility(tmp_path, floor, best):
    result = run_search(
        ZeroScores(), storage=f"sqlite:///{tmp_path / 's.db'}", study_name="zero", max_depth=1,
        eps_metric_abs=floor, show_progress=False,
    )
    rec = result.record({1})
    assert rec.feasible is (floor > 0) and sorted(result.best) == best
    assert rec.bounds["metric"]["tolerance"] == pytest.approx(floor)
    assert rec.bounds["metric"]["lower"] == pytest.approx(GAIN / N * (1 - 1.3406), abs=1e-4)  # -0.0021: t90, 15 df


@pytest.mark.parametrize("floor", [DEFAULT_EPS_METRIC_ABS, 0.0])
def test_validation(floor):
    outcome = validate_candidates([[1]], ZeroScores(), settings=SearchSettings(eps_metric_abs=floor), show_progress=False)
    assert outcome.candidates[0].passed is (floor > 0)
    assert outcome.chosen == ((1,) if floor > 0 else ())


def _result(skip: frozenset[int]) -> EvalResult:
    prompts = [
        PromptRecord(id=f"p{i}", output="x", score=_score(skip, i), accept_length=2.0, tokens_per_s=100.0 + 10 * len(skip),
                     new_tokens=8, steps=4, index=i)
        for i in range(N)
    ]
    return EvalResult(
        skip=skip, accept_length=2.0, metric=sum(p.score for p in prompts) / N, cost=0.5, cost_analytic=0.5,
        cost_measured=0.0, tokens_per_s=prompts[0].tokens_per_s, new_tokens=8 * N, steps=4 * N, wall_s=1.0,
        prompts=prompts,
    )


@pytest.mark.parametrize("floor", [DEFAULT_EPS_METRIC_ABS, 0.0])
def test_report_verdict(floor):
    """Held-out: metric +0.00625 [-0.0047, +0.0172] (90 %, two-sided), 1.1x faster."""
    stats = heldout_stats(_result(frozenset()), _result(frozenset({1})), resamples=200)
    assert stats.metric_diff.lower == pytest.approx(-0.0047, abs=1e-4)
    v = domain_verdict(stats, None, native_metric_mean=0.0, tolerance=MetricTolerance(floor=floor))
    assert v.metric_tolerance == pytest.approx(floor)
    assert v.metric_within_tolerance is (floor > 0) and v.goal_met is (floor > 0)
    assert v.summary.startswith("goal met" if floor > 0 else "goal missed")
