"""``python -m tss_opt.cli.report`` as a function, on the tiny model preset and shipped domains."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from hydra import compose, initialize_config_dir
from project_logs import project_messages

from tss_opt.cli.report import report
from tss_opt.config import config_dir, register_configs
from tss_opt.errors import UsageError
from tss_opt.mapping import MappingError, export_mapping
from tss_opt.search import run_search

TINY_ID = "tiny-llama-4l-seed0"


class Synthetic:
    num_layers = 4
    metric_name = "token_f1"

    def __call__(self, skip: frozenset[int]) -> dict[str, float]:
        a = 2.0 + 0.2 * len(skip) - (0.8 if 0 in skip else 0.0)
        m = 0.5 - (0.3 if 0 in skip else 0.01 * len(skip))
        return {"accept_length": a, "metric": m, "cost": (4 - len(skip)) / 4 / a}


def make_cfg(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=["+model=tiny", "heldout_prompts=2", "max_new_tokens=6", *overrides])


@pytest.fixture(scope="module")
def mapping(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli_report")
    url = f"sqlite:///{tmp / 'tss.db'}"
    run_search(
        Synthetic(), storage=url, study_name="qa.tiny", max_depth=2, eps_metric=0.1, tau_metric=0.1,
        metadata={"model": TINY_ID, "domain": "qa", "drafter": "pld"}, show_progress=False,
    )
    path = tmp / "mapping.yaml"
    export_mapping(url, "qa.tiny", path)
    return tmp, url, path


def test_report_command_writes_everything_and_shows_progress(mapping, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG, logger="tss_opt")
    _, _, path = mapping
    out = tmp_path / "report"
    rep = report(make_cfg(f"mapping_path={path}", f"report_dir={out}"))
    assert [c.domain for c in rep.domains] == ["qa"] and rep.domains[0].num_prompts == 2
    printed = capsys.readouterr().out
    skip = "{" + ", ".join(map(str, rep.domains[0].entry["skip_set"])) + "}"
    assert f"| qa | TSS | {skip} |" in printed and "| qa | Native | — |" in printed
    assert {p.name for p in out.iterdir()} == {"heldout.md", "heldout.json", "profile_qa.png", "pareto_qa.png", "speedup.png"}
    data = json.loads((out / "heldout.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["Native", "TSS"]
    assert data["rows"][1]["skip_set"] == list(rep.domains[0].entry["skip_set"])
    msgs = project_messages(caplog, logging.INFO)
    assert any(m.startswith("domain 1/1: qa, 2 held-out prompts") for m in msgs)
    assert any(m.startswith("domain qa done") for m in msgs)
    # Per prompt: one line each, at DEBUG (INFO keeps one line per domain).
    per_prompt = [r for r in caplog.records if "[qa " in r.getMessage() and "native A=" in r.getMessage()]
    assert len(per_prompt) == 2 and {r.levelno for r in per_prompt} == {logging.DEBUG}


def test_storage_override_finds_a_moved_study(mapping, tmp_path):
    tmp, url, path = mapping
    moved = tmp_path / "moved.db"
    with sqlite3.connect(tmp / "tss.db") as src, sqlite3.connect(moved) as dst:
        src.backup(dst)  # a plain file copy could miss pages still in the WAL
    broken = tmp_path / "mapping.yaml"
    broken.write_text(path.read_text().replace(str(tmp / "tss.db"), str(tmp_path / "gone.db")))
    out = tmp_path / "r1"
    rep = report(make_cfg(f"mapping_path={broken}", f"report_dir={out}"))
    assert rep.domains[0].plots == {} and "gone.db" in rep.domains[0].plot_error
    out2 = tmp_path / "r2"
    rep = report(make_cfg(f"mapping_path={broken}", f"report_dir={out2}", f"storage=sqlite:///{moved}"))
    assert set(rep.domains[0].plots) == {"profile", "pareto"}


def test_report_refuses_unmapped_domains_and_other_models(mapping, tmp_path):
    _, _, path = mapping
    with pytest.raises(UsageError, match="report_domains has 'rag' but the mapping .* only maps qa"):
        report(make_cfg(f"mapping_path={path}", "report_domains=[rag]"))
    other = tmp_path / "other.yaml"
    other.write_text(path.read_text().replace(TINY_ID, "some/other-model"))
    with pytest.raises(MappingError, match="some/other-model"):
        report(make_cfg(f"mapping_path={other}", f"report_dir={tmp_path / 'r'}"))
    with pytest.raises(MappingError, match="does not exist"):
        report(make_cfg(f"mapping_path={tmp_path / 'none.yaml'}"))


def test_report_intervals_settings(mapping, tmp_path):
    _, _, path = mapping
    with pytest.raises(UsageError, match=r"report_confidence=1.5 is out of range"):
        report(make_cfg(f"mapping_path={path}", "report_confidence=1.5"))
    out = tmp_path / "r"
    rep = report(make_cfg(f"mapping_path={path}", f"report_dir={out}", "report_confidence=0.8", "report_bootstrap=300", "report_seed=5"))
    assert (rep.level, rep.resamples, rep.seed) == (0.8, 300, 5)
    sp = rep.domains[0].stats.speedup
    assert (sp.level, sp.resamples, sp.seed) == (0.8, 300, 5)
    data = json.loads((out / "heldout.json").read_text())
    assert data["intervals"]["level"] == 0.8 and data["verdict_rule"]["eps_metric"] == 0.05
