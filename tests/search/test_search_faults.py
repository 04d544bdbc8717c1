"""A search survives a real Ctrl-C (SIGINT) or stall (SIGSTOP) at every step of a worker's life
cycle: creating the study, taking a trial, evaluating, writing attributes, telling.

Each fault is armed in a worker process by wrapping the storage method that writes at that
instant (``search_worker.arm_fault``): the process signals itself before or after calling
through. Every interrupted run must end as the commands end (one line, exit 130), nothing may
count as a crash or be given up, and the resumed search must give the uninterrupted answer
with every configuration completed exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from search_landscape import Landscape
from search_procs import HERE, REPO, outputs, run_one
from search_reference import reference_search

from tss_opt.cli.common import EXIT_INTERRUPTED, INTERRUPTED
from tss_opt.search import load_result
from tss_opt.search.study import FAIL_REASON_KEY


def url_for(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'tss.db'}"
    return "postgresql+psycopg://postgres@127.0.0.1:5432/test"

L, SEED, DEPTH = 6, 0, 2
ARGS = ("--layers", str(L), "--seed", str(SEED), "--max-depth", str(DEPTH), "--sleep", "0")


def _reference():  # noqa: ANN202
    return reference_search(Landscape(L, SEED).measure, L, mode="exhaustive", max_depth=DEPTH)


def assert_interrupted(code: int, stderr: str) -> None:
    """What Ctrl-C must look like: exit 130, the one line last, no traceback or warning."""
    assert code == EXIT_INTERRUPTED, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == INTERRUPTED
    assert "Traceback" not in stderr and "failed with" not in stderr, stderr[-3000:]


def assert_same_search(url: str, study_name: str, workdir: Path) -> None:
    """The stored search equals an uninterrupted one: S*, the completed configurations
    (each exactly once), no crash, nothing given up or left pending."""
    ref = _reference()
    trials = optuna.load_study(study_name=study_name, storage=url).get_trials(deepcopy=False)
    complete = Counter(
        frozenset(t.user_attrs["skip_set"]) for t in trials if t.state == TrialState.COMPLETE
    )
    assert set(complete) == set(ref.evaluated)
    assert all(n == 1 for n in complete.values()), complete
    crashes = [t.number for t in trials
               if t.state == TrialState.FAIL and FAIL_REASON_KEY not in t.system_attrs]  # fmt: skip
    assert crashes == []
    assert all(t.state.is_finished() for t in trials)
    result = load_result(url, study_name)
    assert result.finished and result.given_up == []
    assert result.best == ref.best and set(result.pareto) == ref.pareto
    final = outputs(workdir)[-1]
    assert final["best"] == sorted(ref.best)


# (fault, interrupted runs expected): SIGINT before/after the write of each step. A Ctrl-C
# held during a write is delivered at the next safe point, so a step that completes the
# trial (attributes, tell) is interrupted once and the resume finishes; a step before the
# evaluation (take, parameters) interrupts every run that reaches it.
INSTANTS = {
    "create-study": ("sigint:set_study_user_attr:after:num_layers", 1),
    "take-before": ("sigint:set_trial_state_values:before:RUNNING@2", 2),
    "take-after": ("sigint:set_trial_state_values:after:RUNNING@2", 2),
    "evaluate": ("sigint:evaluator:before:2", 2),
    "attributes": ("sigint:set_trial_user_attr:before:feasible@2", 1),
    "tell-before": ("sigint:set_trial_state_values:before:COMPLETE@2", 1),
    "tell-after": ("sigint:set_trial_state_values:after:COMPLETE@2", 1),
}


def _fault_params() -> list:
    params = []
    for kind in ("sqlite", "postgresql"):
        for name in INSTANTS:
            marks = [] if (kind, name) in {("sqlite", "take-after"), ("sqlite", "tell-before")} else [pytest.mark.slow]
            params.append(pytest.param(kind, name, marks=marks, id=f"{kind}-{name}"))
    return params


@pytest.mark.parametrize("kind,instant", _fault_params())
def test_interrupt_at_each_instant(tmp_path: Path, study_name: str, kind: str, instant: str) -> None:
    url = url_for(kind, tmp_path)
    fault, interrupted = INSTANTS[instant]
    try:
        codes = []
        for i in range(2):  # the same fault armed twice in a row
            code, err = run_one(url, study_name, tmp_path, f"worker{i}", *ARGS, "--fault", fault)
            codes.append(code)
            if code != 0:
                assert_interrupted(code, err)
        assert codes == [EXIT_INTERRUPTED] * interrupted + [0] * (2 - interrupted), codes
        code, err = run_one(url, study_name, tmp_path, "worker2", *ARGS)
        assert code == 0, err[-3000:]
        assert_same_search(url, study_name, tmp_path)
    finally:
        if kind != "sqlite":
            optuna.delete_study(study_name=study_name, storage=url)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_stall_while_telling(tmp_path: Path, study_name: str, kind: str) -> None:
    """A worker stopped while it tells {2}'s result, resumed after another worker failed the
    trial as stale and re-ran it: the late tell is discarded with one info line."""
    url = url_for(kind, tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    hb = ("--heartbeat", "1", "--grace", "3")

    def spawn(name: str, *extra: str) -> subprocess.Popen:
        cmd = [sys.executable, str(HERE / "search_worker.py"), "--storage", url, "--study", study_name,
               "--log", str(tmp_path / f"{name}.log"), "--out", str(tmp_path / f"{name}.json"),
               *ARGS, *hb, *extra]  # fmt: skip
        f = open(tmp_path / f"{name}.stderr", "w")
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=f)

    # The other worker starts once the first has stopped itself telling {2}, so {2} is
    # surely the first's; it fails {2} as stale after the grace period and re-runs it.
    stalled = spawn("worker0", "--fault", "sigstop:set_trial_state_values:before:COMPLETE@2")
    other = None
    try:
        deadline = time.monotonic() + 180
        while not _stopped(stalled.pid):
            assert stalled.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        other = spawn("worker1")
        while not any(t.state == TrialState.FAIL for t in
                      optuna.load_study(study_name=study_name, storage=url).get_trials()):  # fmt: skip
            assert other.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        os.kill(stalled.pid, signal.SIGCONT)
        assert stalled.wait(120) == 0 and other.wait(120) == 0
    finally:
        for p in (stalled, other):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
    err = (tmp_path / "worker0.stderr").read_text()
    assert "late result is discarded" in err
    assert "Traceback" not in err and "failed with" not in err and "Should not reach" not in err
    ref = _reference()
    trials = optuna.load_study(study_name=study_name, storage=url).get_trials()
    complete = Counter(frozenset(t.user_attrs["skip_set"]) for t in trials if t.state == TrialState.COMPLETE)
    assert set(complete) == set(ref.evaluated) and all(n == 1 for n in complete.values())
    failed = [frozenset(t.user_attrs["skip_set"]) for t in trials if t.state == TrialState.FAIL]
    assert failed == [frozenset({2})]  # the stalled trial, failed as stale once
    assert load_result(url, study_name).best == ref.best
    if kind != "sqlite":
        optuna.delete_study(study_name=study_name, storage=url)


@pytest.mark.slow
def test_twenty_random_interrupts(tmp_path: Path, study_name: str) -> None:
    """20 Ctrl-C at random instants of one search (SQLite), resumed each time: every run ends
    with exit 130 (or 0 once finished), never a crash, a hang or a changed answer."""
    url = url_for("sqlite", tmp_path)
    rng = random.Random(22)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    interrupts = 0
    run = 0
    while True:
        ready = tmp_path / f"ready{run}"
        name = f"worker{run:02d}"
        cmd = [sys.executable, str(HERE / "search_worker.py"), "--storage", url, "--study", study_name,
               "--log", str(tmp_path / f"{name}.log"), "--out", str(tmp_path / f"{name}.json"),
               "--ready", str(ready), *ARGS[:-1], "0.01"]  # fmt: skip
        with open(tmp_path / f"{name}.stderr", "w") as f:
            p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=f)
            try:
                if interrupts < 20:
                    while not ready.exists() and p.poll() is None:
                        time.sleep(0.01)
                    time.sleep(rng.uniform(0.0, 0.8))
                    if p.poll() is None:
                        p.send_signal(signal.SIGINT)
                code = p.wait(timeout=120)  # a wait on its own lock would end here
            finally:
                if p.poll() is None:
                    p.kill()
        err = (tmp_path / f"{name}.stderr").read_text()
        run += 1
        if code == 0:
            if interrupts >= 20:
                break
            continue
        assert_interrupted(code, err)
        interrupts += 1
    assert interrupts == 20
    assert_same_search(url, study_name, tmp_path)
