"""The Optuna private API tss_opt relies on (tss_opt/storage/optuna_adapter.py) still exists and
behaves as the adapter assumes; an Optuna release that changes it fails here."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tss_opt.storage import open_storage
from tss_opt.storage import optuna_adapter as adapter

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    storage = open_storage(f"sqlite:///{tmp_path / 'a.db'}", heartbeat_interval=1, grace_period=2)
    return optuna.create_study(storage=storage, directions=["maximize", "minimize"])


def test_installed_optuna_is_a_tested_version() -> None:
    assert optuna.__version__.startswith(adapter.OPTUNA_TESTED_VERSIONS), (
        f"optuna {optuna.__version__}: re-run tests/storage and extend OPTUNA_TESTED_VERSIONS"
    )


def test_study_storage_and_ids(study: optuna.Study) -> None:
    storage = adapter.study_storage(study)
    backend = adapter.unwrap_storage(storage)
    assert type(storage).__name__ == "_CachedStorage"  # what unwrap_storage looks behind
    assert isinstance(backend, optuna.storages.RDBStorage)
    assert adapter.unwrap_storage(backend) is backend
    sid = adapter.study_id(study)
    assert sid == backend.get_study_id_from_name(study.study_name)  # the public equivalent

    trial = study.ask()
    tid = adapter.trial_id(trial)
    assert tid == backend.get_trial_id_from_study_id_trial_number(sid, trial.number)
    (frozen,) = study.get_trials(deepcopy=False)
    assert adapter.trial_id(frozen) == tid


def test_open_trial_honours_fixed_params(study: optuna.Study) -> None:
    study.enqueue_trial({"x": True})
    (waiting,) = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    storage = adapter.study_storage(study)
    tid = adapter.trial_id(waiting)
    assert storage.set_trial_state_values(tid, TrialState.RUNNING)
    trial = adapter.open_trial(study, tid)
    assert isinstance(trial, optuna.Trial) and trial.number == waiting.number
    assert trial.suggest_categorical("x", [False, True]) is True
    study.tell(trial, [1.0, 2.0])
    (done,) = study.get_trials(deepcopy=False)
    assert done.state == TrialState.COMPLETE and done.params == {"x": True}


def test_running_without_heartbeat_query(study: optuna.Study) -> None:
    backend = adapter.unwrap_storage(adapter.study_storage(study))
    trial = study.ask()  # RUNNING, no heartbeat recorded (ask does not start the thread)
    tid = adapter.trial_id(trial)
    sid = adapter.study_id(study)
    assert adapter.running_without_heartbeat(backend, sid, grace_s=3600) == []
    assert adapter.running_without_heartbeat(backend, sid, grace_s=-1) == [tid]
    backend.record_heartbeat(tid)
    assert adapter.running_without_heartbeat(backend, sid, grace_s=-1) == []


def test_public_api_the_search_relies_on() -> None:
    """Signatures of the public calls that replaced private ones (Study.tell's
    skip_if_finished, the storage's conditional state change, heartbeats)."""
    assert "skip_if_finished" in inspect.signature(optuna.Study.tell).parameters
    assert "states" in inspect.signature(optuna.Study.get_trials).parameters
    rdb = optuna.storages.RDBStorage
    for name in ("record_heartbeat", "get_heartbeat_interval", "set_trial_state_values",
                 "get_heartbeat_stale_trial_callback", "remove_session"):  # fmt: skip
        assert callable(getattr(rdb, name)), name
    assert callable(optuna.storages.fail_stale_trials)


def test_no_private_optuna_access_outside_the_adapter() -> None:
    """``._storage``, ``._trial_id``, ``._study_id``, ``._thread_local``, ``._backend`` and
    ``optuna.*._private`` modules appear in tss_opt only in the adapter."""
    private_attrs = {"_storage", "_trial_id", "_study_id", "_thread_local", "_backend"}
    offenders: list[str] = []
    for path in sorted((REPO / "tss_opt").rglob("*.py")):
        if path.name == "optuna_adapter.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private_attrs:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna"):
                if any(p.startswith("_") for p in (node.module or "").split(".")):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.module}")
    assert offenders == []
