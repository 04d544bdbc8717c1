"""User errors, interrupts and their exit codes: one line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tss_opt.config import config_dir, register_configs
from tss_opt.errors import TSSError

REPO = Path(__file__).resolve().parents[2]
register_configs()


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_every_user_error_is_a_tss_error() -> None:
    from tss_opt.errors import UsageError
    from tss_opt.evaluation.domains import DomainError
    from tss_opt.mapping.format import MappingError
    from tss_opt.models.loading import ModelLoadError
    from tss_opt.report.heldout import ReportError
    from tss_opt.search import SearchSettingsError
    from tss_opt.search.contract import EvaluatorError
    from tss_opt.search.run import SearchError
    from tss_opt.search.study import StudyMismatchError
    from tss_opt.storage import StorageError

    for cls in (UsageError, DomainError, MappingError, ModelLoadError, ReportError,
                SearchSettingsError, EvaluatorError, SearchError, StudyMismatchError,
                StorageError):  # fmt: skip
        assert issubclass(cls, TSSError) and issubclass(cls, ValueError), cls


@pytest.mark.parametrize(
    "args, expected",
    [
        # StorageError (a traceback and exit 1 before)
        (["-m", "tss_opt.cli.export", "+domain=qa", "+model=tiny", "storage=nosuch://x"], "nosuch"),
        # ModelLoadError for a local directory that does not exist
        (["-m", "tss_opt.cli.generate", "+model=tiny", "model.source=hf",
          "model.path=/no/such/model_dir", "prompt=hi"], "does not exist"),  # fmt: skip
        (["-m", "tss_opt.cli.evaluate", "+model=tiny", "+domain=qa", "max_new_tokens=0"],
         "max_new_tokens=0"),  # fmt: skip
    ],
)
def test_user_errors_print_one_line_and_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    r = _run(args, tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], r.stderr


_SIGINT_APP = textwrap.dedent(
    """
    import os, signal, time
    from tss_opt.cli.common import hydra_entry

    def task(cfg):
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, mid-command
        time.sleep(30)

    hydra_entry(task)()
    """
)


_SIGINT_IN_TRIAL_APP = textwrap.dedent(
    """
    import os, signal, time
    import optuna
    from tss_opt.cli.common import hydra_entry

    def objective(trial):
        trial.suggest_categorical("skip_0", [False, True])
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while a trial is measured
        time.sleep(30)

    def task(cfg):
        optuna.create_study().optimize(objective, n_trials=1)

    hydra_entry(task)()
    """
)


# A Ctrl-C while a class is created, as during a lazy import of a module with dataclasses:
# Python 3.11 raises it as RuntimeError("Error calling __set_name__ ...") from the interrupt.
# CI once saw exactly that in a search worker (tests/search/test_search_faults.py).
_SIGINT_IN_CLASS_CREATION_APP = textwrap.dedent(
    """
    import os, signal, time
    from tss_opt.cli.common import hydra_entry

    class Field:
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)

    def task(cfg):
        class StoredState:
            missing = Field()

    hydra_entry(task)()
    """
)


@pytest.mark.parametrize(
    "app",
    [_SIGINT_APP, _SIGINT_IN_TRIAL_APP, _SIGINT_IN_CLASS_CREATION_APP],
    ids=["command", "inside_a_trial", "inside_class_creation"],
)
def test_ctrl_c_prints_one_line_and_exits_130(app: str, tmp_path: Path) -> None:
    # Inside a trial Optuna logs the interrupted trial with a traceback; the command drops it.
    r = _run(["-c", app], tmp_path)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip() == "interrupted; run the same command again to resume"


def test_max_new_tokens_zero_is_rejected() -> None:
    from tss_opt.assembly import max_new_tokens_for, require_domain
    from tss_opt.errors import UsageError

    cfg = _compose(["+domain=qa", "max_new_tokens=0"])
    with pytest.raises(UsageError, match=r"max_new_tokens=0 .*integer >= 1"):
        max_new_tokens_for(cfg, require_domain(cfg))
    cfg = _compose(["+domain=qa", "search.max_new_tokens=0"])
    with pytest.raises(UsageError, match=r"search.max_new_tokens=0"):
        max_new_tokens_for(cfg, require_domain(cfg))
    cfg = _compose(["+domain=qa", "max_new_tokens=null", "search.max_new_tokens=null"])
    assert max_new_tokens_for(cfg, require_domain(cfg)) == 96


def test_preset_warning_shows_the_effective_numbers() -> None:
    from tss_opt.assembly import search_settings, study_identity
    from tss_opt.cli.search import effective_note

    cfg = _compose(["+domain=qa", "search.prompts=2", "max_new_tokens=8", "search.max_depth=2"])
    _, meta = study_identity(cfg)
    note = effective_note(cfg, meta["protocol"], search_settings(cfg))
    assert "2 calibration prompts x 8 tokens" in note and "depth <= 2" in note


def test_export_without_the_search_overrides_lists_the_studies(tmp_path: Path) -> None:
    import sys as _sys

    _sys.path.insert(0, str(REPO / "tests" / "search"))
    from search_landscape import Landscape

    from tss_opt.assembly import study_identity
    from tss_opt.cli.export import export
    from tss_opt.errors import UsageError
    from tss_opt.search import run_search

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    searched = _compose(["+domain=qa", "+model=tiny", f"storage={url}", "search.prompts=2"])
    name, meta = study_identity(searched)
    run_search(Landscape(4, 0), storage=url, study_name=name, metadata=meta, show_progress=False,
               mode="exhaustive", max_depth=1)  # fmt: skip
    other = _compose(["+domain=qa", "+model=tiny", f"storage={url}", f"mapping_path={tmp_path}/m.yaml"])
    with pytest.raises(UsageError) as e:
        export(other)
    msg = str(e.value)
    assert f"study_name={name}" in msg and "search.prompts=2" in msg and "+model=tiny" in msg
    export(_compose(["+domain=qa", f"storage={url}", f"study_name={name}",
                     f"mapping_path={tmp_path}/m.yaml"]))  # fmt: skip
    assert (tmp_path / "m.yaml").exists()
