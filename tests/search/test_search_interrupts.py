"""The interrupt guard with real SIGINTs, and a study whose creation was cut short."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from search_landscape import Landscape

from tss_opt.search import run_search
from tss_opt.search.interrupts import InterruptGuard


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs at the next bytecode of the main thread


def test_guard_holds_ctrl_c_until_a_safe_point() -> None:
    guard = InterruptGuard()
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with guard.held():
            _sigint()
            reached.append("after the signal")  # held: the block goes on
            assert guard.pending
            guard.check()
            reached.append("after check")  # never reached
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_guard_delivers_at_once_inside_interruptible() -> None:
    guard = InterruptGuard()
    with guard.held():
        with pytest.raises(KeyboardInterrupt):
            with guard.interruptible():
                _sigint()
                pytest.fail("not interrupted")
        assert not guard.pending and not guard.forced


def test_guard_releases_a_held_ctrl_c_when_the_block_ends() -> None:
    guard = InterruptGuard()
    with pytest.raises(KeyboardInterrupt):
        with guard.held():
            _sigint()
    # A second Ctrl-C while one is held raises where it lands and marks the guard forced.
    guard = InterruptGuard()
    with pytest.raises(KeyboardInterrupt):
        with guard.held():
            _sigint()
            _sigint()
            pytest.fail("the second Ctrl-C must raise at once")
    assert guard.forced


def test_half_made_study_is_finished_on_resume(tmp_path: Path, study_name: str) -> None:
    """A study left with part of its identity (its creator stopped in between, the failure
    seen as "num_layers: stored None") is completed by the next run."""
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    study = optuna.create_study(
        storage=url, study_name=study_name, directions=["maximize", "maximize", "minimize"]
    )
    study.set_user_attr("search_settings", {"mode": "exhaustive", "max_depth": 1})
    result = run_search(Landscape(6, 0), storage=url, study_name=study_name, mode="exhaustive",
                        max_depth=1, show_progress=False)  # fmt: skip
    assert result.finished and len(result.trials) == 7
    attrs = optuna.load_study(study_name=study_name, storage=url).user_attrs
    assert attrs["num_layers"] == 6 and attrs["metric_name"] == "f1"
