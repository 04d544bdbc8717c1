"""Loading for GPUs, checked on the CPU: refused attention implementations, weights placed by
``device_map``, and draft models that follow the target's device and dtype."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tss_opt.decoding.drafters.registry import build_drafter
from tss_opt.decoding.target import TargetModel
from tss_opt.models import ModelConfig, ModelLoadError, as_model_config, load_model
from tss_opt.models.loading import ATTN_IMPLEMENTATIONS, from_pretrained_kwargs


@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention", "paged_attention"])
def test_attention_the_engine_cannot_serve_is_refused(impl):
    with pytest.raises(ModelLoadError, match=f"attn_implementation='{impl}'.*supported: sdpa, eager"):
        as_model_config({"name": "x", "source": "tiny", "attn_implementation": impl})
    for ok in ATTN_IMPLEMENTATIONS:  # the test can fail: the supported ones pass
        assert as_model_config({"name": "x", "source": "tiny", "attn_implementation": ok}).attn_implementation == ok


def test_flash_attention_command_exits_2_with_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.generate", "+model=tiny", "prompt=hi",
         "model.attn_implementation=flash_attention_2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "flash_attention_2" in lines[0] and "supported: sdpa, eager" in lines[0]
    assert "Traceback" not in r.stderr


def test_checkpoints_load_straight_to_the_device(tiny, tmp_path):
    """``device_map`` places the weights as they are read; a saved tiny model loads through
    the hf path on the configured device and dtype."""
    mc = as_model_config({"name": "t", "source": "hf", "path": str(tmp_path), "device": "cuda:1", "dtype": "bfloat16"})
    kw = from_pretrained_kwargs(mc, torch.bfloat16)
    assert kw["device_map"] == "cuda:1" and kw["dtype"] is torch.bfloat16 and kw["attn_implementation"] == "sdpa"
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model({"name": "t", "source": "hf", "path": str(tmp_path), "num_layers": 4, "dtype": "bfloat16"})
    p = next(loaded.model.parameters())
    assert p.device.type == "cpu" and p.dtype is torch.bfloat16


def test_draft_model_follows_the_target_device_and_dtype():
    """The draft model's own config says float32; the target runs in bfloat16: the drafter is
    built in bfloat16 on the target's device."""
    target_loaded = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="bfloat16"))
    target = TargetModel(target_loaded.model)
    cfg = {"name": "draft_model", "num_tokens": 5, "model": {"name": "tiny", "source": "tiny", "num_layers": 2, "dtype": "float32",
                                            "device": "cpu"}}
    drafter = build_drafter(cfg, target, target_loaded)
    p = next(drafter.model.parameters())
    assert p.dtype is torch.bfloat16 and p.device == target.device
    assert drafter.device == target.device
    tree = drafter.propose(torch.tensor([5, 6, 7, 8]))  # it drafts in that dtype
    assert len(tree) == 5
