"""``python -m tss_opt.cli.evaluate ... json_out=PATH``: the plain function behind it, on the tiny model."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from tss_opt.cli.evaluate import evaluate
from tss_opt.config import config_dir, register_configs

register_configs()


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_json_out_holds_the_aggregate_and_per_prompt(tmp_path, capsys):
    out = tmp_path / "sub" / "eval.json"
    cfg = _compose(["+model=tiny", "+domain=qa", "split=validation", "skip=[2]", "max_new_tokens=6", f"json_out={out}"])
    r = evaluate(cfg)
    assert f"wrote {out}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["domain"] == "qa" and doc["split"] == "validation" and doc["model"] == "tiny"
    assert doc["skip"] == [2] and doc["prompts"] == 16 and doc["max_new_tokens"] == 6
    for key in ("accept_length", "metric", "cost", "cost_analytic", "tokens_per_s", "new_tokens", "metric_extras"):
        assert key in doc
    assert doc["accept_length"] == r.accept_length and doc["metric"] == r.metric
    rows = doc["per_prompt"]
    # the validation split, in order, with the per-prompt figures and the output text
    from tss_opt.assembly import require_domain

    assert [row["id"] for row in rows] == [ex.id for ex in require_domain(cfg).split("validation")]
    assert [row["index"] for row in rows] == list(range(16))
    for row, p in zip(rows, r.prompts, strict=True):
        assert row["accept_length"] == p.accept_length and row["metric"] == p.score
        assert row["tokens"] == p.new_tokens <= 6 and row["repetition"] == p.repetition
        assert row["output"] == p.output
    assert doc["metric"] == pytest.approx(sum(row["metric"] for row in rows) / 16)


def test_json_out_to_a_folder_is_refused(tmp_path):
    cfg = _compose(["+model=tiny", "+domain=qa", "split=validation", "max_new_tokens=2", f"json_out={tmp_path}"])
    with pytest.raises(ValueError, match="is a folder; give a file path"):
        evaluate(cfg)
