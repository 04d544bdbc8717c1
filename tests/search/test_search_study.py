"""The Optuna study of a search: attributes, constraints, settings checks, evaluator errors."""

from __future__ import annotations

import re

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from search_landscape import Landscape
from search_reference import reference_search

from tss_opt.search import (
    BreadthFirstSampler,
    EvaluatorError,
    SearchSettings,
    StudyMismatchError,
    load_result,
    run_search,
    study_name_for,
)
from tss_opt.search.study import FAIL_REASON_KEY

L = 8
SETTINGS = dict(mode="exhaustive", max_depth=2)
META = {"model": "synthetic/model-8", "domain": "qa", "drafter": "pld", "split": "calibration"}


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tss.db'}"


def _run(land, url: str, name: str, **kw):
    settings = {**SETTINGS, **kw}
    return run_search(
        land, storage=url, study_name=name, show_progress=False, metadata=META, **settings
    )


def test_study_records_what_the_dashboard_and_optuna_read(url: str, study_name: str) -> None:
    land = Landscape(L, 0)
    result = _run(land, url, study_name)
    study = optuna.load_study(study_name=study_name, storage=url)

    assert study.metric_names == ["accept_length", "f1", "cost"]
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MAXIMIZE", "MINIMIZE"]
    attrs = study.user_attrs
    assert attrs["metadata"] == {**META, "num_layers": L}
    assert attrs["num_layers"] == L and attrs["metric_name"] == "f1"
    assert attrs["search_settings"] == SearchSettings(**SETTINGS).to_dict()
    assert attrs["result"]["best"] == sorted(result.best)

    by_set = {frozenset(t.user_attrs["skip_set"]): t for t in study.trials}
    assert set(by_set) == result.evaluated
    for skip, t in by_set.items():
        assert t.state == TrialState.COMPLETE
        assert t.params == {f"skip_{i}": i in skip for i in range(L)}
        assert all(d == CategoricalDistribution([False, True]) for d in t.distributions.values())
        assert t.user_attrs["level"] == len(skip) == t.user_attrs["num_skipped"]
        assert t.user_attrs["sparsity"] == len(skip) / L
        expected = land.measure(skip)
        assert t.values == [expected["accept_length"], expected["metric"], expected["cost"]]
        assert t.user_attrs["tokens_per_s"] == expected["tokens_per_s"]
        assert t.user_attrs["metric_extras"] == expected["metric_extras"]  # nested dict kept
        # Feasibility stored twice: Optuna's constraint API and the legacy list.
        legacy = t.system_attrs["constraints"]
        assert legacy == [t.constraints["accept_length"], t.constraints["f1"]]
        assert t.user_attrs["feasible"] == all(c <= 0 for c in legacy)
        assert t.user_attrs["feasible"] == result.record(skip).feasible

    # The constraint values are [(A0 - eps_A) - A, (M0 - eps_M) - M].
    base = land.measure(frozenset())
    one = by_set[frozenset({3})]
    assert one.system_attrs["constraints"] == pytest.approx(
        [base["accept_length"] * 0.95 - one.values[0], base["metric"] * 0.95 - one.values[1]]
    )
    # Optuna's best_trials respects the constraints: it is our Pareto set.
    assert {frozenset(t.user_attrs["skip_set"]) for t in study.best_trials} == set(result.pareto)
    assert any(not t.user_attrs["feasible"] for t in study.trials)


def test_resume_with_other_settings_is_refused(url: str, study_name: str) -> None:
    _run(Landscape(L, 0), url, study_name)
    with pytest.raises(StudyMismatchError) as e:
        _run(Landscape(L, 0), url, study_name, max_depth=3, eps_accept=0.1)
    message = str(e.value)
    assert "max_depth: stored 2, requested 3" in message
    assert "eps_accept: stored 0.05, requested 0.1" in message
    assert study_name in message and "study_name" in message and "delete" in message

    with pytest.raises(StudyMismatchError, match="directions"):
        _run(Landscape(L, 0, metric_higher_is_better=False), url, study_name)
    with pytest.raises(StudyMismatchError, match="num_layers: stored 8, requested 6"):
        _run(Landscape(6, 0), url, study_name)
    with pytest.raises(StudyMismatchError, match=re.escape("metadata.model")):
        run_search(
            Landscape(L, 0),
            storage=url,
            study_name=study_name,
            show_progress=False,
            metadata={**META, "model": "other/model"},
            **SETTINGS,
        )


def test_selection_can_change_without_reevaluating(url: str, study_name: str) -> None:
    _run(Landscape(L, 3), url, study_name)
    land = Landscape(L, 3)
    result = _run(land, url, study_name, selection="triple_win")
    assert land.calls == 0
    ref = reference_search(Landscape(L, 3).measure, L, selection="triple_win", **SETTINGS)
    assert result.best == ref.best and result.selection == "triple_win"
    assert load_result(url, study_name).selection == "triple_win"


def test_study_name_for() -> None:
    name = study_name_for(
        domain="qa", model="HuggingFaceTB/SmolLM2-135M-Instruct", drafter="pld", split="calibration"
    )
    assert re.fullmatch(r"qa\.smollm2_135m_instruct\.pld\.calibration\.s[0-9a-f]{7}", name)
    same = study_name_for(
        domain="qa",
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        drafter="pld",
        split="calibration",
        settings=SearchSettings(selection="triple_win", heartbeat_interval=5, grace_period=20),
    )
    assert same == name  # selection and heartbeats do not define the search
    other = study_name_for(
        domain="qa",
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        drafter="pld",
        split="calibration",
        settings=SearchSettings(eps_accept=0.1),
    )
    assert other != name and other.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]


class _Broken:
    num_layers = 4

    def __init__(self, bad: dict) -> None:
        self.bad = bad

    def __call__(self, skip: frozenset[int]) -> dict:
        if skip:
            return self.bad
        return {"accept_length": 2.0, "metric": 0.5, "cost": 1.0}


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"accept_length": 2.0, "cost": 1.0}, "lacks 'metric'"),
        ({"accept_length": float("nan"), "metric": 0.5, "cost": 1.0}, "not finite"),
        ({"accept_length": "high", "metric": 0.5, "cost": 1.0}, "not a number"),
    ],
)
def test_bad_evaluator_results_fail_clearly(url: str, study_name: str, bad, match) -> None:
    with pytest.raises(EvaluatorError, match=match):
        run_search(_Broken(bad), storage=url, study_name=study_name, show_progress=False)
    study = optuna.load_study(study_name=study_name, storage=url)
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "EvaluatorError" in failed[0].system_attrs[FAIL_REASON_KEY]


def test_evaluator_attributes_are_checked(url: str, study_name: str) -> None:
    class NoLayers:
        def __call__(self, skip):
            return {}

    with pytest.raises(EvaluatorError, match="num_layers"):
        run_search(NoLayers(), storage=url, study_name=study_name)
    with pytest.raises(ValueError, match="leave no layer of 8 to skip"):
        run_search(
            Landscape(L, 0), storage=url, study_name=study_name, early_barrier=5, latter_barrier=3
        )


def test_plain_optimize_with_empty_queue_is_refused() -> None:
    sampler = BreadthFirstSampler(SearchSettings(), L)
    study = optuna.create_study(sampler=sampler, directions=["maximize", "maximize", "minimize"])
    with pytest.raises(ValueError, match="only runs configurations it queued"):
        study.optimize(lambda t: (t.suggest_categorical("skip_0", [False, True]), 0, 0), n_trials=1)
    # Filling the queue first makes plain Study.optimize run the baseline.
    sampler.fill_queue(study)
    assert [t.user_attrs["skip_set"] for t in study.get_trials(states=(TrialState.WAITING,))] == [
        []
    ]
