"""Interrupted searches resume to the same result without re-running completed trials."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from search_landscape import Landscape, read_log
from search_procs import spawn_workers, stderr_of, wait_all
from search_reference import reference_search

from tss_opt.search import run_search
from tss_opt.search.study import FAIL_REASON_KEY

L, SEED = 8, 0
SETTINGS = dict(mode="exhaustive", max_depth=3)


def _ref(**kw):
    return reference_search(Landscape(L, SEED).measure, L, **{**SETTINGS, **kw})


def test_ctrl_c_then_resume(tmp_path, study_name: str) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    ref = _ref()
    first = Landscape(L, SEED, interrupt_after=12)  # the 12th evaluation is in level 2
    with pytest.raises(KeyboardInterrupt):
        run_search(first, storage=url, study_name=study_name, show_progress=False, **SETTINGS)
    completed = set(first.seen)
    assert len(completed) == 11

    second = Landscape(L, SEED)
    result = run_search(second, storage=url, study_name=study_name, show_progress=False, **SETTINGS)
    # No completed trial is evaluated again; together the two runs cover the reference once.
    assert not completed & set(second.seen)
    assert len(second.seen) == len(set(second.seen))
    assert completed | set(second.seen) == set(ref.evaluated)
    assert result.best == ref.best
    assert set(result.pareto) == ref.pareto
    assert [(lv.level, lv.evaluated, lv.feasible) for lv in result.levels] == ref.levels

    trials = optuna.load_study(study_name=study_name, storage=url).get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1
    assert "KeyboardInterrupt" in failed[0].system_attrs[FAIL_REASON_KEY]
    retried = frozenset(failed[0].user_attrs["skip_set"])
    assert retried in second.seen

    # A finished study: calling again evaluates nothing and returns the same result.
    third = Landscape(L, SEED)
    again = run_search(third, storage=url, study_name=study_name, show_progress=False, **SETTINGS)
    assert third.calls == 0
    assert again.best == result.best and again.pareto == result.pareto


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path, study_name: str) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    ref = _ref(max_depth=2)
    victim = frozenset({1, 2})  # a level-2 set (1 and 2 are in the pool)
    assert victim in ref.evaluated
    procs = spawn_workers(
        1, url, study_name, tmp_path,
        "--sleep", "0.0", "--heartbeat", "1", "--grace", "2", "--kill-on", "1,2",
        "--max-depth", "2",
    )  # fmt: skip
    assert wait_all(procs, tmp_path) == [-9], stderr_of(tmp_path)
    completed = {s for what, s in read_log(tmp_path / "worker0.log") if what == "done"}
    assert victim not in completed and len(completed) >= 9  # levels 0 and 1 at least

    # The killed trial is still RUNNING; the resumed run fails it once its heartbeat is
    # stale, re-runs it, and finishes the search.
    resumed = Landscape(L, SEED)
    result = run_search(
        resumed,
        storage=url,
        study_name=study_name,
        heartbeat_interval=1,
        grace_period=2,
        show_progress=False,
        **{**SETTINGS, "max_depth": 2},
    )
    assert not completed & set(resumed.seen)
    assert completed | set(resumed.seen) == set(ref.evaluated)
    assert victim in resumed.seen
    assert result.best == ref.best and set(result.pareto) == ref.pareto
    states = [t.state for t in optuna.load_study(study_name=study_name, storage=url).get_trials()]
    assert states.count(TrialState.FAIL) == 1
    assert states.count(TrialState.COMPLETE) == len(ref.evaluated)
