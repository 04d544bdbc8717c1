"""Host reads of tensor values per decoding step, per drafter, counted with a
wrapper around ``.item()``/``.tolist()``/``.cpu()``/``int()``/``float()``/``bool()``.

On the CPU every read counts, also of host tensors (a draft's token list, the context): the
numbers are upper bounds of the device -> host syncs a GPU pays. docs/engine.md lists them
beside the GPU figures (device tensors only) that benchmarks/gpu_check.py measures.
"""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding.drafters import DraftModelDrafter, PromptLookupDrafter
from tss_opt.decoding.drafters.eagle import EagleDrafter, random_eagle_head
from tss_opt.decoding.drafters.registry import build_drafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.host_syncs import count_host_syncs
from tss_opt.decoding.target import TargetModel

# Reads per step at most, on the CPU (docs/engine.md, "Host syncs per step").
MAX_READS_PER_STEP = {
    "plain": 3,
    "pld": 3,
    "draft_model": 5,
    "draft_model_sampled": 6,
    "eagle": 4,
    "token_recycle": 11,
    "samd": 11,
}


def _drafter(name: str, tiny, target):
    if name == "plain":
        return None
    if name == "pld":
        return PromptLookupDrafter(num_tokens=4)
    if name == "draft_model":
        return DraftModelDrafter(tiny.model, num_tokens=3, skip=[1])
    if name == "draft_model_sampled":
        return DraftModelDrafter(tiny.model, num_tokens=3, temperature=0.7, skip=[1], seed=3)
    if name == "eagle":
        return EagleDrafter(random_eagle_head(tiny.model, seed=0), total_tokens=12, depth=4, top_k=3)
    return build_drafter({"name": name}, target, tiny)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("name", sorted(MAX_READS_PER_STEP))
def test_host_reads_per_step_stay_at_the_documented_bound(tiny, name, temperature):
    if name == "draft_model_sampled" and temperature == 0:
        pytest.skip("a sampling draft model is verified at temperature > 0")
    target = TargetModel(tiny.model)
    prompt = tiny.tokenizer("ab ab ab ab the cat the cat", return_tensors="pt").input_ids[0]
    engine = SpeculativeEngine(target, _drafter(name, tiny, target))
    with count_host_syncs() as reads:
        res = engine.generate(prompt, max_new_tokens=24, temperature=temperature, seed=1)
    steps = res.stats.steps
    assert steps >= 5
    per_step = sum(reads.values()) / steps
    assert per_step <= MAX_READS_PER_STEP[name], (name, temperature, per_step, dict(reads))


def test_the_counter_sees_reads_and_restores_torch():
    t = torch.arange(4)
    with count_host_syncs() as reads:
        t.tolist(), int(t[0]), float(t[1]), t.sum().item(), bool(t[2]), t.cpu()
    assert reads == {"tolist": 1, "__int__": 1, "__float__": 1, "item": 1, "__bool__": 1, "cpu": 1}
    with count_host_syncs(device="cuda") as device_reads:  # only tensors of that device type
        t.tolist()
    assert sum(device_reads.values()) == 0
    assert torch.Tensor.tolist.__name__ == "tolist"  # restored
