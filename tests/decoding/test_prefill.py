"""A reused dense prefill is lossless: same tokens as a request that prefills itself."""

from __future__ import annotations

import pytest
import torch
from reference import greedy_dense_prefill

from tss_opt.decoding.drafters import DraftModelDrafter, PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.prefill import dense_prefill
from tss_opt.decoding.target import TargetModel

N_NEW = 30


@pytest.fixture(scope="module")
def prompt(tiny64) -> torch.Tensor:
    text = "the cat sat on the mat. the cat sat on the hat. the dog sat on the"
    return tiny64.tokenizer(text, return_tensors="pt").input_ids[0]


def _snapshot(pre) -> list[torch.Tensor]:
    return [t.clone() for layer in pre.cache.layers for t in (layer.keys, layer.values)] + [pre.logits.clone(), pre.hidden.clone()]


@pytest.mark.parametrize("drafter", ["none", "pld", "draft_model"])
def test_reused_prefill_emits_the_same_tokens(tiny64, prompt, drafter):
    target = TargetModel(tiny64.model)
    pre = dense_prefill(target, prompt)
    before = _snapshot(pre)
    assert pre.layer_forwards == 4
    make = {
        "none": lambda: None,
        "pld": lambda: PromptLookupDrafter(num_tokens=5),
        "draft_model": lambda: DraftModelDrafter(tiny64.model, num_tokens=3, skip=[2]),
    }[drafter]
    # Dense, sparse and layer-0 skip sets (layer 0 is the FACTS.md pitfall), the same prefill
    # reused by every request, in a row.
    outputs = set()
    for skip in [(), {1, 2}, {0}, (), {3}]:
        plain = SpeculativeEngine(target, make()).generate(prompt, max_new_tokens=N_NEW, skip=skip, scope="verify")
        reused = SpeculativeEngine(target, make()).generate(
            prompt, max_new_tokens=N_NEW, skip=skip, scope="verify", prefill=pre
        )
        assert reused.tokens.tolist() == plain.tokens.tolist()
        outputs.add(tuple(plain.tokens.tolist()))
        assert reused.stats.steps == plain.stats.steps and reused.stats.step_tokens == plain.stats.step_tokens
        assert plain.stats.prefill_layer_forwards == 4 and reused.stats.prefill_layer_forwards == 0
        assert reused.stats.verify_layer_forwards == plain.stats.verify_layer_forwards
    assert len(outputs) >= 3, "the skip sets must change the output, or this test proves little"
    # Independent reference for a sparse set, and the stored prefill was never written to.
    assert reused.tokens.tolist() == greedy_dense_prefill(tiny64.model, prompt, N_NEW, {3})
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(pre), strict=True))


def test_reused_prefill_with_sampling(tiny64, prompt):
    target = TargetModel(tiny64.model)
    pre = dense_prefill(target, prompt)
    kw = dict(max_new_tokens=N_NEW, skip={1}, scope="verify", temperature=0.8, seed=3)
    plain = SpeculativeEngine(target, PromptLookupDrafter(num_tokens=4)).generate(prompt, **kw)
    reused = SpeculativeEngine(target, PromptLookupDrafter(num_tokens=4)).generate(prompt, prefill=pre, **kw)
    assert reused.tokens.tolist() == plain.tokens.tolist()


def test_all_scope_and_other_prompts_refuse_a_reused_prefill(tiny64, prompt):
    target = TargetModel(tiny64.model)
    pre = dense_prefill(target, prompt)
    engine = SpeculativeEngine(target)
    # Under "all" the prefill itself skips layers, so its result differs from the dense one.
    with target.skip({1, 2}):
        sparse_logits, _ = target.prefill(prompt, target.new_cache())
    assert not torch.allclose(sparse_logits, pre.logits)
    with pytest.raises(ValueError, match="scope='all' skips layers in the prefill too"):
        engine.generate(prompt, max_new_tokens=N_NEW, skip={1, 2}, scope="all", prefill=pre)
    with pytest.raises(ValueError, match="belongs to another prompt"):
        engine.generate(prompt[:-1], max_new_tokens=N_NEW, prefill=pre)
