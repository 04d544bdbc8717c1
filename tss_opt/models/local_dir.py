"""A model as a directory another engine can load (vLLM reads checkpoints, not our configs).

- ``hf``: its ``path`` (a local directory, or a hub id the engine resolves itself);
- ``gguf_package``: the safetensors conversion under ``cache_dir`` (made once, as loading does);
- ``tiny``: the random model and its tokenizer saved once under ``cache_dir``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tss_opt.config.model import ModelConfig
from tss_opt.models.loading import ModelLoadError, as_model_config, load_model
from tss_opt.models.publish import publish_dir, staging_dir

__all__ = ["checkpoint_dir"]


def checkpoint_dir(cfg: ModelConfig | Mapping[str, Any]) -> str:
    """A directory (or hub id) holding the model's ``config.json``, weights and tokenizer.

    Raises:
        ModelLoadError: The model cannot be found or converted (the message says the fix).
    """
    mc = as_model_config(cfg)
    if mc.source == "hf":
        if not mc.path:
            raise ModelLoadError(f"model {mc.name!r} has source=hf but no path; set model.path")
        return str(mc.path)
    if mc.source == "gguf_package":
        cache = Path(mc.cache_dir) / mc.name
        if not (cache / "model.safetensors").is_file():
            load_model(mc)  # converts the GGUF file into the cache once
        return str(cache.resolve())
    t = mc.tiny
    out = Path(mc.cache_dir) / (
        f"{mc.name}-{mc.num_layers}l-seed{mc.seed}-h{t.hidden_size}-i{t.intermediate_size}"
        f"-a{t.num_attention_heads}-kv{t.num_key_value_heads}"
    )
    if not (out / "config.json").is_file():
        loaded = load_model(mc)
        tmp = staging_dir(out)  # atomic, and safe beside another process (publish.py)
        loaded.model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        publish_dir(tmp, out, complete=lambda d: (d / "config.json").is_file())
    return str(out.resolve())
