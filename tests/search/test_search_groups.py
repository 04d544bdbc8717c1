"""Grouped trials (``search.group_size``): a worker claims several queued trials and
evaluates them in one call; every configuration is still evaluated exactly once, across
workers and storages, an interrupt re-queues the whole group, and the answer equals a
one-at-a-time search's."""

from __future__ import annotations

import logging

import optuna
import pytest
from optuna.trial import TrialState
from search_landscape import GroupLandscape, Landscape
from search_procs import evaluations, outputs, spawn_workers, stderr_of, wait_all
from search_reference import reference_search

from tss_opt.config.search import SearchSettings, SearchSettingsError
from tss_opt.search import run_search
from tss_opt.search.grouping import AUTO_GROUP_SIZE, resolve_group_size
from tss_opt.search.lifecycle import INTERRUPTED_REASON
from tss_opt.search.study import FAIL_REASON_KEY

L, SEED = 8, 0
SETTINGS = dict(mode="exhaustive", max_depth=3)


def _ref(**kw):
    return reference_search(Landscape(L, SEED).measure, L, **{**SETTINGS, **kw})


def test_group_size_setting_is_checked_and_not_identity() -> None:
    assert SearchSettings().group_size == "auto"
    assert SearchSettings(group_size="3").group_size == 3
    with pytest.raises(SearchSettingsError, match=r"group_size=0 is invalid; expected a positive integer"):
        SearchSettings(group_size=0)
    with pytest.raises(SearchSettingsError, match="group_size='many'"):
        SearchSettings(group_size="many")
    assert SearchSettings(group_size=4).identity() == SearchSettings(group_size=1).identity()


def test_group_size_resolution(caplog) -> None:
    grouped, plain = GroupLandscape(L, SEED), Landscape(L, SEED)
    assert resolve_group_size(4, grouped) == 4
    assert resolve_group_size("auto", grouped) == AUTO_GROUP_SIZE["cpu"]  # no target: CPU
    assert resolve_group_size("auto", plain) == 1
    with caplog.at_level(logging.INFO, logger="tss_opt.search"):
        assert resolve_group_size(4, plain) == 1
    assert "search.group_size=4 is ignored" in caplog.text


def test_grouped_search_equals_one_at_a_time(tmp_path, study_name: str) -> None:
    ref = _ref()
    land = GroupLandscape(L, SEED)
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    result = run_search(land, storage=url, study_name=study_name, show_progress=False, group_size=4, **SETTINGS)
    assert max(len(g) for g in land.groups) == 4  # it really grouped
    assert sorted(map(sorted, land.seen)) == sorted(map(sorted, ref.evaluated))  # each once
    assert result.best == ref.best and set(result.pareto) == ref.pareto
    assert [(lv.level, lv.evaluated, lv.feasible) for lv in result.levels] == ref.levels
    # The stored values equal a one-at-a-time search's, trial by trial.
    one = f"sqlite:///{tmp_path / 'one.db'}"
    run_search(Landscape(L, SEED), storage=one, study_name=study_name, show_progress=False, group_size=1, **SETTINGS)

    def values(url: str) -> dict[tuple[int, ...], list[float]]:
        trials = optuna.load_study(study_name=study_name, storage=url).get_trials()
        return {tuple(t.user_attrs["skip_set"]): t.values for t in trials if t.state == TrialState.COMPLETE}

    assert values(url) == values(one)


def test_ctrl_c_in_a_group_requeues_all_of_it_and_resumes(tmp_path, study_name: str) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    ref = _ref()
    first = GroupLandscape(L, SEED, interrupt_after=12)  # inside a level-2 group of 3
    with pytest.raises(KeyboardInterrupt):
        run_search(first, storage=url, study_name=study_name, show_progress=False, group_size=3, **SETTINGS)
    hit = first.groups[-1]
    assert len(hit) == 3
    trials = optuna.load_study(study_name=study_name, storage=url).get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    # every trial of the interrupted group is failed as interrupted (re-queued), none RUNNING
    assert {frozenset(t.user_attrs["skip_set"]) for t in failed} == set(hit)
    assert all(t.system_attrs[FAIL_REASON_KEY] == INTERRUPTED_REASON for t in failed)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    completed = set(first.seen)

    second = GroupLandscape(L, SEED)
    result = run_search(second, storage=url, study_name=study_name, show_progress=False, group_size=3, **SETTINGS)
    assert not completed & set(second.seen)
    assert set(hit) <= set(second.seen)
    assert completed | set(second.seen) == set(ref.evaluated)
    assert result.best == ref.best and set(result.pareto) == ref.pareto


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", ["postgresql"], indirect=True)
def test_four_grouping_workers_on_postgresql_evaluate_each_set_once(storage_url, study_name, tmp_path) -> None:
    ref = _ref()
    procs = spawn_workers(
        4, storage_url, study_name, tmp_path, "--sleep", "0.1", "--max-depth", "3", "--group-size", "3",
    )  # fmt: skip
    codes = wait_all(procs, tmp_path)
    assert codes == [0, 0, 0, 0], stderr_of(tmp_path)
    started, done = evaluations(tmp_path)
    assert set(done) == set(ref.evaluated)
    assert set(done.values()) == {1} and started == done  # exactly once, none started twice
    outs = outputs(tmp_path)
    assert max(max(o["groups"], default=0) for o in outs) == 3  # claims were grouped
    for out in outs:
        assert out["best"] == sorted(ref.best)
        assert out["pareto"] == sorted(sorted(c) for c in ref.pareto)
        assert [tuple(x) for x in out["levels"]] == ref.levels
    trials = optuna.load_study(study_name=study_name, storage=storage_url).get_trials()
    complete = [tuple(t.user_attrs["skip_set"]) for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == len(set(complete)) == len(ref.evaluated)  # no duplicate COMPLETE params


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", ["postgresql"], indirect=True)
def test_sigkilled_grouping_worker_leaves_its_group_to_be_retried(storage_url, study_name, tmp_path) -> None:
    ref = _ref(max_depth=2)
    procs = spawn_workers(
        3, storage_url, study_name, tmp_path, "--sleep", "0.1", "--heartbeat", "1", "--grace", "2",
        "--kill-on", "2", "--max-depth", "2", "--group-size", "3",
    )  # fmt: skip
    codes = wait_all(procs, tmp_path)
    assert sorted(codes) == [-9, 0, 0], stderr_of(tmp_path)
    started, done = evaluations(tmp_path)
    assert set(done) == set(ref.evaluated) and set(done.values()) == {1}
    rerun = {s for s, n in started.items() if n == 2}
    assert frozenset({2}) in rerun and all(n <= 2 for n in started.values())
    trials = optuna.load_study(study_name=study_name, storage=storage_url).get_trials()
    failed = [frozenset(t.user_attrs["skip_set"]) for t in trials if t.state == TrialState.FAIL]
    assert set(failed) == rerun  # the killed group's trials went stale and were re-run once
    for out in outputs(tmp_path):
        assert out["best"] == sorted(ref.best)


# A real SIGINT at a storage write of a grouping worker (test_search_faults' machinery, with
# --group-size 3): between two claims ("take-after": the claims so far are failed as
# interrupted), while writing a grouped trial's attributes and before its tell (held: the
# group's trials are told, then the worker stops). Runs interrupted of the two armed runs.
GROUP_INSTANTS = {
    "take-after": ("sigint:set_trial_state_values:after:RUNNING@2", 2),
    "attributes": ("sigint:set_trial_user_attr:before:feasible@2", 1),
    "tell-before": ("sigint:set_trial_state_values:before:COMPLETE@2", 1),
}


@pytest.mark.parametrize("instant", list(GROUP_INSTANTS))
def test_interrupt_of_a_grouping_worker_resumes_to_the_same_search(tmp_path, study_name: str, instant: str) -> None:
    from search_procs import run_one
    from test_search_faults import ARGS, assert_interrupted, assert_same_search

    from tss_opt.cli.common import EXIT_INTERRUPTED

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    fault, interrupted = GROUP_INSTANTS[instant]
    codes = []
    for i in range(2):  # the same fault armed twice in a row
        code, err = run_one(url, study_name, tmp_path, f"worker{i}", *ARGS, "--group-size", "3", "--fault", fault)
        codes.append(code)
        if code != 0:
            assert_interrupted(code, err)
    assert codes == [EXIT_INTERRUPTED] * interrupted + [0] * (2 - interrupted), codes
    trials = optuna.load_study(study_name=study_name, storage=url).get_trials()
    if instant == "take-after":  # every claim of the interrupted groups was failed as interrupted
        failed = [t for t in trials if t.state == TrialState.FAIL]
        assert failed and all(t.system_attrs[FAIL_REASON_KEY] == INTERRUPTED_REASON for t in failed)
    code, err = run_one(url, study_name, tmp_path, "worker2", *ARGS, "--group-size", "3")
    assert code == 0, err[-3000:]
    assert_same_search(url, study_name, tmp_path)


def test_memo_groups_only_what_it_has_not_measured() -> None:
    from tss_opt.search.grouping import group_call
    from tss_opt.search.memo import MemoEvaluator

    inner = GroupLandscape(L, SEED)
    memo = MemoEvaluator(inner)
    assert group_call(memo) is not None and group_call(MemoEvaluator(Landscape(L, SEED))) is None
    a, b, c = frozenset({1}), frozenset({2}), frozenset({1, 3})
    assert memo.call_group([a, b]) == [inner.measure(a), inner.measure(b)]
    assert memo.call_group([b, c, a]) == [inner.measure(b), inner.measure(c), inner.measure(a)]
    assert inner.groups == [[a, b], [c]]
    assert (memo.hits, memo.misses) == (2, 3)
