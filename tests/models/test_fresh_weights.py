"""``fresh_cpu_weights`` (tss_opt/models/loading.py): every CPU parameter copied into memory of
its own when a model loads, the values, the strides and the ties kept."""

from __future__ import annotations

import torch

from tss_opt.config.model import TinyConfig
from tss_opt.models import load_model, loading
from tss_opt.models.loading import fresh_cpu_weights
from tss_opt.models.tiny import build_tiny_model


def test_each_parameter_gets_memory_of_its_own_with_its_values_strides_and_ties():
    model = build_tiny_model(TinyConfig(), num_layers=2, seed=0, dtype=torch.bfloat16)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's head is
    # A transposed parameter keeps its strides (a copy must not silently change the layout).
    model.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(model.model.layers[0].mlp.up_proj.weight.detach().t().contiguous().t())
    before = {name: (p.detach().clone(), p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    params = list(model.parameters())
    assert fresh_cpu_weights(model) == len(params) == len(before)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]  # the same Parameter objects
    for name, p in model.named_parameters():
        value, ptr, stride = before[name]
        assert torch.equal(p.detach(), value) and p.stride() == stride
        assert p.data_ptr() != ptr, name
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_load_model_copies_the_weights_it_returns(monkeypatch):
    seen: list[torch.nn.Module] = []
    real = loading.fresh_cpu_weights
    monkeypatch.setattr(loading, "fresh_cpu_weights", lambda model: seen.append(model) or real(model))
    loaded = load_model({"name": "tiny", "source": "tiny", "num_layers": 2, "dtype": "float32"})
    assert seen == [loaded.model]
    again = load_model({"name": "tiny", "source": "tiny", "num_layers": 2, "dtype": "float32"})
    for a, b in zip(loaded.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the same values: only the memory moved
