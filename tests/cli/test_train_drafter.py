"""``python -m tss_opt.cli.train_drafter``: end to end on the tiny model, the domain contract
(+domain, train.general, train.domains), the drafter dispatch and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tss_opt.assembly import assemble
from tss_opt.cli.train_drafter import train_drafter, train_settings, training_domains
from tss_opt.config import config_dir, register_configs
from tss_opt.decoding.drafters import EagleDrafter
from tss_opt.errors import TSSError, UsageError
from tss_opt.evaluation.domains import DomainError
from tss_opt.training import TrainingDataError, TrainingSettingsError

register_configs()
TOY = [f"the {a} sat on the {b}. the {a} sat on the {b}." for a in ("cat", "dog", "fox") for b in ("mat", "log")]


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _toy_conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "domain").mkdir(parents=True)
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "prompt": p, "references": ["x"]}) + "\n" for i, p in enumerate(TOY)))
    (conf / "domain" / "toy.yaml").write_text(
        f"name: toy\ndata: {data}\nmetric: token_f1\npool_size: 6\ncalibration_size: 3\nvalidation_size: 1\nheldout_size: 2\n"
    )
    return conf


@pytest.mark.timeout(300)
def test_train_drafter_end_to_end_on_the_tiny_model(tmp_path: Path) -> None:
    conf = _toy_conf(tmp_path)
    args = [
        sys.executable, "-m", "tss_opt.cli.train_drafter", "--config-dir", str(conf), "+model=tiny", "+domain=toy",
        "drafter=eagle", "drafter.total_tokens=12", "drafter.depth=4", "drafter.top_k=3", "train.max_steps=40",
        "train.lr=3e-3", "train.seq_len=64", "train.continuation_tokens=32", "train.probe_every=20",
        "train.probe_prompts=2", "train.progress=false",
    ]
    r = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = tmp_path / "storage" / "drafters" / "tiny" / "toy"
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "pytorch_model.bin", "training.json"]
    out = r.stdout
    assert "training text: 3 sequences" in out and "toy: 3 calibration + 0 extra prompts" in out
    assert "EAGLE head for tiny on toy:" in out and "steps                  40" in out
    assert "probe accepted length  random head" in out and "(2 calibration prompts x 32 tokens)" in out
    assert f"use it with: drafter=eagle drafter.checkpoint={Path('storage/drafters/tiny/toy')}" in out
    meta = json.loads((ckpt / "training.json").read_text())
    assert meta["model"] == "tiny" and meta["domains"] == ["toy"] and meta["total_steps"] == 40
    assert [h["step"] for h in meta["history"]] == [0, 20, 40]
    assert meta["data"]["toy"]["calibration"] == 3
    # drafter=eagle drafter.checkpoint=PATH uses it (a fixed tree: with total_tokens=auto the
    # drafter is sized from this host's measured latency and may be plain decoding when busy).
    cfg = _compose(["+model=tiny", "drafter=eagle", f"drafter.checkpoint={ckpt}", "drafter.total_tokens=12"])
    assert isinstance(assemble(cfg).new_drafter(), EagleDrafter)


def test_domain_contract() -> None:
    s = train_settings(_compose(["drafter=eagle", "train.general=true"]))
    label, domains = training_domains(_compose(["drafter=eagle", "train.general=true"]), s)
    assert label == "general" and [d.name for d in domains] == ["mmlu", "qa", "rag", "summarization", "translation"]
    cfg = _compose(["drafter=eagle", "train.domains=[qa,rag]"])
    label, domains = training_domains(cfg, train_settings(cfg))
    assert label == "qa+rag" and [d.name for d in domains] == ["qa", "rag"]
    cfg = _compose(["drafter=eagle", "+domain=qa"])
    assert training_domains(cfg, train_settings(cfg))[0] == "qa"


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        (["+domain=qa"], UsageError, r"train_drafter trains drafter=eagle or drafter=t2d; got drafter='pld' \(the model's default; add drafter=eagle\)"),
        (["+domain=qa", "drafter=pld"], UsageError, r"got drafter='pld'$"),
        (["drafter=eagle"], UsageError, r"no domain chosen; add \+domain=NAME \(available: mmlu, qa, rag, summarization, translation\), or train.general=true"),
        (["drafter=eagle", "+domain=qa", "train.general=true"], UsageError, r"give one or the other"),
        (["drafter=eagle", "train.domains=[qaa]"], DomainError, r"Unknown domain 'qaa'. Did you mean 'qa'\?"),
        (["drafter=eagle", "+domain=qa", "train.max_steps=0", "train.max_minutes=null"], TrainingSettingsError, r"train.max_steps=0 is invalid"),
        (["drafter=eagle", "+domain=qa", "train.max_minutes=-1"], TrainingSettingsError, r"train.max_minutes=-1.0 is invalid"),
        (["drafter=eagle", "+domain=summarization", "train.sources=[extra]"], TrainingDataError, r"domain 'summarization' has no training text"),
    ],
)
def test_errors_before_any_model_is_loaded(overrides: list[str], error: type[TSSError], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import tss_opt.cli.train_drafter as cmd

    monkeypatch.setattr(cmd, "assemble", lambda cfg: pytest.fail("loaded a model"))
    with pytest.raises(error, match=message):
        train_drafter(_compose(overrides))


def test_t2d_through_the_command_writes_a_drafter_that_decodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _compose([
        "+model=tiny", "+domain=qa", "drafter=t2d", "train.extra_prompts=0", "train.probe_prompts=1",
        "drafter.train.trials=2", "drafter.train.steps=2", "drafter.train.continuation_tokens=4",
        "drafter.train.max_tokens_per_text=32", "drafter.train.latency_reps=1",
    ])
    report = train_drafter(cfg)
    out = tmp_path / "storage" / "drafters" / "tiny" / "qa" / "t2d"
    assert Path(report.out_dir).resolve() == out and (out / "t2d_report.json").is_file()
    assert report.eval_agreement_after is not None  # measured on the validation prompts
    printed = capsys.readouterr().out
    assert "kept layers" in printed and "drafter=t2d drafter.path=storage/drafters/tiny/qa/t2d" in printed
    from tss_opt.decoding.drafters import build_drafter

    rt = assemble(_compose(["+model=tiny"]))
    assert build_drafter({"name": "t2d", "path": str(out)}, rt.target, rt.loaded) is not None


def test_drafter_checkpoint_names_the_output_and_resume_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "my_head"
    base = [
        "+model=tiny", "+domain=qa", "drafter=eagle", f"drafter.checkpoint={out}", "train.max_steps=3",
        "train.extra_prompts=0", "train.continuation_tokens=8", "train.probe_prompts=0", "train.progress=false",
        "train.seq_len=32",
    ]
    res = train_drafter(_compose(base))
    assert res.checkpoint == out and (out / "pytorch_model.bin").is_file()
    assert (tmp_path / "storage" / "drafters" / "tiny" / ".cache").is_dir()  # the text cache stays under out_dir
    assert not (tmp_path / "storage" / "drafters" / "tiny" / "qa").exists()
    res = train_drafter(_compose([*base, "train.resume=true"]))
    assert (res.steps, res.total_steps) == (3, 6)
    assert "steps                  3 (6 in all)" in capsys.readouterr().out
