"""A storage password is shown nowhere: output, run logs, mapping, study or trial attributes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest

from tss_opt.storage import STORAGE_ENV_VAR, mask_secrets, resolve_storage_url

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cretPW"
# Trust authentication: PostgreSQL accepts the password and ignores it.
URL = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:5432/test"
SMALL = [
    "+model=tiny", "+domain=qa", "search.prompts=1", "max_new_tokens=4",
    "search.mode=exhaustive", "search.max_depth=1", "search.early_barrier=0",
    "search.latter_barrier=0", "search.max_trials=null",
]  # fmt: skip


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=full_env
    )


def test_mask_secrets_and_env_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    text = f"storage={URL} and 'mysql+pymysql://root:p@ss@db:3306/x' sqlite:///a.db"
    masked = mask_secrets(text)
    assert PASSWORD not in masked and "p@ss" not in masked
    assert "postgres:***@127.0.0.1" in masked and "sqlite:///a.db" in masked
    monkeypatch.setenv(STORAGE_ENV_VAR, URL)
    assert resolve_storage_url(None) == URL
    assert resolve_storage_url("sqlite:///b.db") == "sqlite:///b.db"
    # The Hydra spelling documented in docs/storage.md.
    from hydra import compose, initialize_config_dir

    from tss_opt.config import config_dir, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["storage=${oc.env:TSS_STORAGE}"])
    assert cfg.storage == URL
    monkeypatch.delenv(STORAGE_ENV_VAR)
    assert resolve_storage_url(None) == "sqlite:///storage/tss.db"


@pytest.mark.slow
def test_password_appears_nowhere(tmp_path: Path) -> None:
    study = f"secret-{uuid.uuid4().hex[:8]}"
    mapping = tmp_path / "map.yaml"
    common = [*SMALL, f"study_name={study}", f"mapping_path={mapping}"]
    outputs = []
    try:
        # A search with the URL on the command line...
        r = _run(["-m", "tss_opt", *common, f"storage={URL}"], tmp_path)
        assert r.returncode == 0, mask_secrets(r.stderr[-3000:])
        assert "mapping:" in r.stdout
        outputs.append(r.stdout + r.stderr)
        assert PASSWORD not in outputs[-1], f"password in the output of step {len(outputs)}"
        # ...a user error that names the storage...
        r = _run(["-m", "tss_opt.cli.export", *SMALL, "study_name=nope", f"storage={URL}"], tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("error:"), mask_secrets(r.stderr)
        outputs.append(r.stdout + r.stderr)
        assert PASSWORD not in outputs[-1], f"password in the output of step {len(outputs)}"
        # ...an unexpected failure (Hydra would echo the overrides); a study of its own, since
        # the evaluator is part of a study's identity (the first study would refuse it, exit 2)...
        broken = [*SMALL, f"study_name={study}-broken", f"mapping_path={mapping}"]
        r = _run(["-m", "tss_opt", *broken, f"storage={URL}", "evaluator._target_=no.such.fn"], tmp_path)
        assert r.returncode == 1 and "Traceback" in r.stderr
        outputs.append(r.stdout + r.stderr)
        assert PASSWORD not in outputs[-1], f"password in the output of step {len(outputs)}"
        # ...and launch, which passes the URL to its workers in TSS_STORAGE, not argv.
        r = _run(["-m", "tss_opt.cli.launch", *common, f"storage={URL}", "devices=[cpu]"], tmp_path)
        assert r.returncode == 0, mask_secrets(r.stderr[-3000:])
        assert "starting worker" in r.stdout + r.stderr and "1 workers finished" in r.stdout
        outputs.append(r.stdout + r.stderr)
        assert PASSWORD not in outputs[-1], f"password in the output of step {len(outputs)}"
        # The URL from the environment alone (storage unset) reaches the same study.
        r = _run(["-m", "tss_opt.cli.export", *common], tmp_path, env={STORAGE_ENV_VAR: URL})
        assert r.returncode == 0, mask_secrets(r.stderr[-3000:])
        outputs.append(r.stdout + r.stderr)
        assert PASSWORD not in outputs[-1], f"password in the output of step {len(outputs)}"

        for text in outputs:
            assert PASSWORD not in text
        files = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert any(p.suffix == ".log" for p in files)  # Hydra's run logs were written
        for p in files:
            assert PASSWORD not in p.read_text(errors="replace"), p
        stored = optuna.load_study(study_name=study, storage=URL)
        dump = json.dumps(
            [stored.user_attrs, stored._storage.get_study_system_attrs(stored._study_id)]
            + [[t.user_attrs, t.system_attrs] for t in stored.get_trials()],
            default=str,
        )
        assert PASSWORD not in dump
        assert "postgres:***@" in mapping.read_text()
    finally:
        for name in (study, f"{study}-broken"):
            try:
                optuna.delete_study(study_name=name, storage=URL)
            except KeyError:
                pass
