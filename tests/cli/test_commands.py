"""The commands as users run them: Hydra composition, errors, a tiny end-to-end search."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from tss_opt.config import config_dir, register_configs
from tss_opt.models import ModelConfig, as_model_config

REPO = Path(__file__).resolve().parents[2]
register_configs()


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", ["smollm2_135m", "llama13b", "vicuna7b", "tiny"])
def test_every_model_preset_composes_and_validates(name):
    cfg = _compose([f"+model={name}", "+domain=qa"])
    mc = as_model_config(cfg.model)
    assert mc.name == name
    # each preset spells out every field, so +model=X never inherits the default's values
    raw = yaml.safe_load((config_dir() / "model" / f"{name}.yaml").read_text())
    missing = {f for f in ModelConfig.__dataclass_fields__ if f != "tiny"} - set(raw)
    assert not missing, f"conf/model/{name}.yaml lacks {sorted(missing)}"


def test_default_model_and_paper_preset():
    cfg = _compose(["+domain=qa", "search=paper", "dtype=bfloat16", "device=cpu"])
    assert cfg.model.name == "smollm2_135m"
    assert cfg.search.preset == "paper" and cfg.search.prompts is None and cfg.search.selection == "triple_win"
    assert cfg.dtype == "bfloat16"


def test_model_default_drafter_is_used():
    from tss_opt.assembly import drafter_config

    cfg = _compose(["+domain=qa", "+model=llama13b"])
    assert drafter_config(cfg)["name"] == "samd"
    cfg = _compose(["+domain=qa", "+model=llama13b", "drafter=pld"])
    assert drafter_config(cfg)["name"] == "pld"


def test_misspelt_key_fails_at_compose_time():
    with pytest.raises(Exception, match="serch|not in struct|Could not override"):
        _compose(["+domain=qa", "serch.mode=beam"])


def test_missing_and_unknown_domain_list_the_options(tmp_path):
    r = _run(["-m", "tss_opt"], tmp_path)
    assert r.returncode == 2
    assert "+domain=NAME" in r.stderr and "summarization" in r.stderr
    r = _run(["-m", "tss_opt", "+domain=qaa"], tmp_path)
    assert r.returncode != 0
    assert "Available options in 'domain'" in r.stderr and "qa" in r.stderr
    r = _run(["-m", "tss_opt", "+domain=qa", "+model=gpt9"], tmp_path)
    assert r.returncode != 0 and "llama13b" in r.stderr


def test_generate_command_prints_output_and_stats(tmp_path):
    r = _run(["-m", "tss_opt.cli.generate", "+model=tiny", "prompt='hello there, hello there'", "skip=[1]", "max_new_tokens=12"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "accepted length" in r.stdout and "skip=[1]" in r.stdout and "new tokens" in r.stdout
    r = _run(["-m", "tss_opt.cli.generate", "+model=tiny", "prompt=hi", "skip=[9]"], tmp_path)
    assert r.returncode == 2 and "0..3" in r.stderr


@pytest.mark.slow
def test_user_domain_from_config_dir_searches_end_to_end(tmp_path):
    """A domain added as one YAML + one JSONL in a --config-dir: loads, evaluates, searches,
    and the mapping is written; nothing lands outside the configured paths."""
    conf = tmp_path / "my_conf"
    (conf / "domain").mkdir(parents=True)
    data = tmp_path / "legal.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"l{i}", "prompt": f"Is clause {i} binding?", "references": ["yes"]}) for i in range(6)))
    (conf / "domain" / "legal.yaml").write_text(
        f"name: legal\ndata: {data}\nmetric: token_f1\nmax_new_tokens: 6\npool_size: 6\ncalibration_size: 2\nvalidation_size: 0\nheldout_size: 4\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    r = _run(
        [
            "-m", "tss_opt", "--config-dir", str(conf), "+domain=legal", "+model=tiny",
            "search.early_barrier=0", "search.latter_barrier=0", "search.max_depth=1",
            f"storage=sqlite:///{tmp_path}/s.db", f"mapping_path={tmp_path}/map.yaml",
        ],
        work,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "level 1 complete: evaluated 4/4" in r.stdout + r.stderr
    mapping = yaml.safe_load((tmp_path / "map.yaml").read_text())
    assert "legal" in json.dumps(mapping)
    assert {p.name for p in work.iterdir()} <= {"storage"}  # Hydra's run dir only, under storage/
