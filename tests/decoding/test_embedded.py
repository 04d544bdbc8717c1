"""Lossless on the real embedded model (SmolLM2-135M, 30 layers), short outputs."""

from __future__ import annotations

import pytest
from reference import greedy_dense_prefill, greedy_no_cache

from tss_opt.decoding.drafters import DraftModelDrafter, PromptLookupDrafter, SelfDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel

pytestmark = pytest.mark.slow
N_NEW = 24


def _drafter(name, model):
    return {
        "none": None,
        "pld": PromptLookupDrafter(num_tokens=10),
        # The only other causal LM with this tokenizer here is the model itself.
        "draft_model": DraftModelDrafter(model, num_tokens=4),
        "self": SelfDrafter(model, skip=range(8, 20), num_tokens=4),
    }[name]


@pytest.mark.parametrize("name", ["none", "pld", "draft_model", "self"])
def test_dense_equals_hf_generate(embedded, summarization_prompts, name):
    target = TargetModel(embedded.model)
    for prompt in summarization_prompts:
        ref = embedded.model.generate(prompt[None], max_new_tokens=N_NEW, do_sample=False, eos_token_id=None)
        out = SpeculativeEngine(target, _drafter(name, embedded.model)).generate(prompt, max_new_tokens=N_NEW)
        assert out.tokens.tolist() == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("skip", [{0}, {29}, {14, 15}])
def test_sparse_equals_independent_greedy_both_scopes(embedded, summarization_prompts, skip):
    target = TargetModel(embedded.model)
    prompt = summarization_prompts[0]
    for scope, ref_fn in (("all", greedy_no_cache), ("verify", greedy_dense_prefill)):
        ref = ref_fn(embedded.model, prompt, N_NEW, skip)
        for name in ("pld", "self"):
            out = SpeculativeEngine(target, _drafter(name, embedded.model)).generate(
                prompt, max_new_tokens=N_NEW, skip=skip, scope=scope
            )
            assert out.tokens.tolist() == ref, (scope, name)
