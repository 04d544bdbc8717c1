"""The serve command and ``build_controller`` (the controller from the configuration) on the tiny model preset."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from tss_opt.assembly.serving import build_controller
from tss_opt.cli.serve import serve
from tss_opt.config import config_dir, register_configs
from tss_opt.mapping import MappingError
from tss_opt.runtime import BACKGROUND, router_cache_path

SKIPS = {"qa": [1], "translation": [2, 3]}


def make_cfg(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=["+model=tiny", "max_new_tokens=8", *overrides])


def test_serve_labelled_request_prints_domain_skip_set_output_and_stats(write_mapping, capsys):
    path = write_mapping(SKIPS)
    res = serve(make_cfg(f"mapping_path={path}", "prompt=who wrote hamlet?", "request_domain=qa"))
    out = capsys.readouterr().out
    assert res.domain == "qa" and res.skip_set == frozenset({1}) and not res.routed
    assert "domain: qa [from request_domain]" in out
    assert "skip set: {1} (1/4 layers skipped)" in out
    assert res.text in out
    assert "accepted length (bonus incl.)" in out and "skipped layers" in out and "1 of 4" in out
    # A labelled request needs no router: none was fitted.
    assert not router_cache_path(path, "tiny-llama-4l-seed0").exists()


def test_serve_unmapped_domain_says_dense(write_mapping, capsys):
    res = serve(make_cfg(f"mapping_path={write_mapping(SKIPS)}", "prompt=hello", "request_domain=mmlu"))
    out = capsys.readouterr().out
    assert res.skip_set == frozenset() and "not in the mapping: dense" in out and "skip set: — (0/4" in out


def test_from_config_fits_the_router_once_and_reuses_it(write_mapping, caplog):
    caplog.set_level(logging.INFO, logger="tss_opt.runtime")
    path = write_mapping(SKIPS)
    cfg = make_cfg(f"mapping_path={path}")
    c = build_controller(cfg)
    assert c.router is not None
    assert c.router.domains == ["mmlu", "qa", "rag", "summarization", "translation"]
    cache = router_cache_path(path, "tiny-llama-4l-seed0")
    assert cache.is_file() and any("router: saved" in r.getMessage() for r in caplog.records)
    caplog.clear()
    again = build_controller(cfg)
    assert any("router: loaded" in r.getMessage() for r in caplog.records)
    assert again.router.thresholds == pytest.approx(c.router.thresholds)
    assert BACKGROUND in again.router.classes
    res = again.generate("Translate German to English: Das Haus ist groß.")
    assert res.similarity is not None
    assert res.skip_set == again.skip_set_for(res.domain)


def test_from_config_refuses_a_mapping_for_another_model(write_mapping):
    path = write_mapping(SKIPS, model="HuggingFaceTB/SmolLM2-135M-Instruct", num_layers=30)
    with pytest.raises(MappingError, match="loaded model is 'tiny-llama-4l-seed0'"):
        build_controller(make_cfg(f"mapping_path={path}", "request_domain=qa"))


def test_serve_command_reports_a_missing_mapping(tmp_path):
    missing = tmp_path / "missing.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.serve", "+model=tiny", "prompt=hi", f"mapping_path={missing}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert f"error: Mapping file {missing} does not exist" in proc.stderr


def test_empty_mapping_serves_dense_without_fitting_a_router(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tss_opt.runtime")
    path = tmp_path / "mapping.yaml"
    path.write_text("format: 1\ndomains: {}\n", encoding="utf-8")
    c = build_controller(make_cfg(f"mapping_path={path}"))
    assert c.router is None and not router_cache_path(path, "tiny-llama-4l-seed0").exists()
    assert any("has no domains" in r.getMessage() for r in caplog.records)
    res = c.generate("hello")
    assert res.domain is None and res.skip_set == frozenset()


def test_serve_applies_the_domain_system_prompt_as_the_search_did(write_mapping, tmp_path, monkeypatch):
    """A mapped user domain's ``system_prompt`` (from its --config-dir YAML) is in the request
    ids, exactly as ``format_prompt`` built the search's prompts; other domains get none."""
    from tss_opt.decoding import batch as batch_mod
    from tss_opt.evaluation.domains import Example, format_prompt
    from tss_opt.runtime import domain_system_prompts

    conf = tmp_path / "user_conf"
    (conf / "domain").mkdir(parents=True)
    (conf / "domain" / "mine.yaml").write_text("name: mine\ndata: unused.jsonl\nsystem_prompt: Answer with one number.\n")
    prompts = domain_system_prompts(["mine", "qa"], config_dirs=[config_dir(), conf])
    assert prompts == {"mine": "Answer with one number.", "qa": None}

    seen = []
    real = batch_mod.BatchEngine.admit

    def spy(self, ids, *args, **kwargs):
        seen.append(ids.tolist())
        return real(self, ids, *args, **kwargs)

    monkeypatch.setattr(batch_mod.BatchEngine, "admit", spy)
    c = build_controller(make_cfg(f"mapping_path={write_mapping({'mine': [1], 'qa': [2]})}", "request_domain=mine"))
    c.system_prompts = {d: p for d, p in prompts.items() if p}
    c.generate("What is 6 times 7?", "mine")
    c.generate("What is 6 times 7?", "qa")
    tok = c.tokenizer
    ex = Example(id="x", prompt="What is 6 times 7?", references=())
    assert seen[0] == format_prompt(tok, ex, "Answer with one number.").tolist()
    assert seen[1] == format_prompt(tok, ex, None).tolist()


def test_serving_in_another_precision_than_searched_warns(write_mapping, caplog):
    import yaml

    path = write_mapping(SKIPS)
    data = yaml.safe_load(path.read_text())
    data["domains"]["qa"]["dtype"] = "float32"  # what a search records (tss_opt.mapping.format)
    path.write_text(yaml.safe_dump(data))
    with caplog.at_level(logging.WARNING, logger="tss_opt.assembly.serving"):
        build_controller(make_cfg(f"mapping_path={path}", "request_domain=qa", "dtype=float32"))
    assert not [r for r in caplog.records if "serving in" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="tss_opt.assembly.serving"):
        c = build_controller(make_cfg(f"mapping_path={path}", "request_domain=qa", "dtype=bfloat16"))
    (line,) = [r.getMessage() for r in caplog.records if "serving in" in r.getMessage()]
    assert "serving in bfloat16" in line and "qa in float32" in line and "dtype=float32" in line
    assert c.target.dtype.is_floating_point and str(c.target.dtype) == "torch.bfloat16"
