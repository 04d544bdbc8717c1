"""Several worker processes on one study: SQLite, PostgreSQL and MySQL; a SIGKILLed worker."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from search_landscape import Landscape
from search_procs import evaluations, outputs, spawn_workers, stderr_of, wait_all
from search_reference import reference_search

from tss_opt.search import load_result
from tss_opt.search.study import FAIL_REASON_KEY

L, SEED = 8, 0
# 1 + 8 + 21 + 35 = 65 configurations (seed 0): enough overlap between 3 workers, quick.
SETTINGS = dict(mode="exhaustive", max_depth=3)
DEPTH = ("--max-depth", "3")


def _expected(max_depth: int = 3):
    return reference_search(Landscape(L, SEED).measure, L, **{**SETTINGS, "max_depth": max_depth})


def _check_level_barrier(trials: list[optuna.trial.FrozenTrial]) -> None:
    """No trial of level k starts before every trial of level k-1 has finished."""
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    by_level: dict[int, list[optuna.trial.FrozenTrial]] = {}
    for t in done:
        by_level.setdefault(t.user_attrs["level"], []).append(t)
    for k in sorted(by_level)[1:]:
        last_prev = max(t.datetime_complete for t in by_level[k - 1])
        first = min(t.datetime_start for t in by_level[k])
        assert first >= last_prev, f"level {k} started before level {k - 1} was complete"


@pytest.mark.slow
def test_three_workers_share_one_study(storage_url: str, study_name: str, tmp_path) -> None:
    ref = _expected()
    procs = spawn_workers(3, storage_url, study_name, tmp_path, "--sleep", "0.05", *DEPTH)
    codes = wait_all(procs, tmp_path)
    assert codes == [0, 0, 0], stderr_of(tmp_path)

    started, done = evaluations(tmp_path)
    # Every configuration of the reference evaluated exactly once, none missing, none extra.
    assert set(done) == set(ref.evaluated)
    assert set(done.values()) == {1}
    assert started == done
    # Every worker returns the result of a single-worker run.
    for out in outputs(tmp_path):
        assert out["best"] == sorted(ref.best)
        assert out["pareto"] == sorted(sorted(c) for c in ref.pareto)
        assert out["pool"] == list(ref.pool)
        assert [tuple(x) for x in out["levels"]] == ref.levels

    study = optuna.load_study(study_name=study_name, storage=storage_url)
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.state.name for t in trials) == ["COMPLETE"] * len(ref.evaluated)
    _check_level_barrier(trials)
    result = load_result(storage_url, study_name)
    assert result.best == ref.best and result.finished


@pytest.mark.slow
def test_sigkilled_worker_trial_is_retried_once(
    storage_url: str, study_name: str, tmp_path
) -> None:
    ref = _expected(max_depth=2)  # 1 + 8 + 21 configurations: the kill is what matters here
    victim = frozenset({2})
    procs = spawn_workers(
        3,
        storage_url,
        study_name,
        tmp_path,
        "--sleep", "0.1",
        "--heartbeat", "1",
        "--grace", "2",
        "--kill-on", "2",
        "--max-depth", "2",
    )  # fmt: skip
    codes = wait_all(procs, tmp_path)
    # The worker that evaluated {2} first killed itself with SIGKILL; the others finished.
    assert sorted(codes) == [-9, 0, 0], stderr_of(tmp_path)

    started, done = evaluations(tmp_path)
    assert set(done) == set(ref.evaluated)
    assert set(done.values()) == {1}
    assert started[victim] == 2  # killed once, re-run once
    assert all(n == 1 for s, n in started.items() if s != victim)  # nothing else re-run
    for out in outputs(tmp_path):
        assert out["best"] == sorted(ref.best)
        assert out["pareto"] == sorted(sorted(c) for c in ref.pareto)

    trials = optuna.load_study(study_name=study_name, storage=storage_url).get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [frozenset(t.user_attrs["skip_set"]) for t in failed] == [victim]
    assert FAIL_REASON_KEY not in failed[0].system_attrs  # failed as heartbeat-stale
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    assert retry[0].system_attrs["retry_history"] == [failed[0].number]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == len(ref.evaluated)
    _check_level_barrier(trials)
