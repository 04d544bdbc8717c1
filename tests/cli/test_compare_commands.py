"""compare / sweep / profile on the tiny model with tiny budgets; their bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["+domain=qa", "+model=tiny", "search.prompts=1", "max_new_tokens=4", "search.early_barrier=0", "search.latter_barrier=0"]


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    # This checkout's package, even where another copy is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_bad_strategy_and_budget_fail_before_loading_a_model(tmp_path):
    r = _run(["tss_opt.cli.compare", *TINY, "strategies=[beam,greedy]"], tmp_path)
    assert r.returncode == 2 and "unknown strategy 'greedy'; expected one of: exhaustive, beam, sleb" in r.stderr
    r = _run(["tss_opt.cli.compare", *TINY, "strategies=[sleb]", "search.max_trials=3"], tmp_path)
    assert r.returncode == 2 and "first level needs 5 evaluations" in r.stderr
    r = _run(["tss_opt.cli.compare", *TINY], tmp_path)
    assert r.returncode == 2 and "no strategies listed" in r.stderr


@pytest.mark.slow
def test_compare_then_profile(tmp_path):
    db = f"sqlite:///{tmp_path}/t.db"
    rep = tmp_path / "rep"
    r = _run(["tss_opt.cli.compare", *TINY, "strategies=[beam,sleb,tpe]", "search.max_trials=6", "heldout_prompts=1",
              f"storage={db}", f"report_dir={rep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((rep / "compare_qa.json").read_text())
    assert [row["label"] for row in data["rows"]] == ["beam", "sleb", "tpe"]
    for row in data["rows"]:
        assert 1 <= row["evaluations"] <= 6 and row["heldout"]["accept_length"] is not None
        assert row["generated_tokens"] > 0 and row["curve"][-1][0] == row["evaluations"]
    assert (rep / "compare_qa.png").stat().st_size > 1000
    assert "| dense |" in (rep / "compare_qa.md").read_text()
    # Three studies, one per strategy, in the storage.
    assert len(optuna.get_all_study_names(db)) == 3
    r = _run(["tss_opt.cli.profile", *TINY, "search.mode=sleb", "search.max_trials=6", f"storage={db}", f"report_dir={rep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| 3 |" in r.stdout and list(rep.glob("profile_*.png"))


@pytest.mark.slow
def test_sweep_writes_table_four(tmp_path):
    rep = tmp_path / "rep"
    r = _run(["tss_opt.cli.sweep", *TINY, "search.max_trials=6", "sweep_tolerances=[0.05,-0.1]", "heldout_prompts=0",
              f"storage=sqlite:///{tmp_path}/t.db", f"report_dir={rep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((rep / "sweep_qa.json").read_text())
    assert [row["label"] for row in data["rows"]] == ["+5%", "-10%"]
    assert data["rows"][0]["settings"]["eps_accept"] == -0.05 and data["rows"][1]["settings"]["eps_accept"] == 0.1


def test_replay_throughput_is_never_shown_as_a_decoding_speed():
    from omegaconf import OmegaConf

    from tss_opt.cli.compare import REPLAY_NOTE, hide_replay_speed
    from tss_opt.report.compare import ComparisonRow

    def row() -> ComparisonRow:
        return ComparisonRow(label="beam", study_name="s", skip_set=[3], sparsity=0.1,
                             calibration={"accept_length": 2.0, "metric": 0.1, "tokens_per_s": 49.3}, curve=[])

    replay, engine = row(), row()
    cfg = OmegaConf.create({"evaluator": {"kind": "replay"}})
    assert hide_replay_speed(cfg, [replay]) == REPLAY_NOTE and replay.calibration["tokens_per_s"] is None
    cfg = OmegaConf.create({"evaluator": {"kind": "engine"}})
    assert hide_replay_speed(cfg, [engine]) == "" and engine.calibration["tokens_per_s"] == 49.3
