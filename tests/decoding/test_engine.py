"""The engine is lossless: greedy speculative decoding emits greedy decoding's tokens."""

from __future__ import annotations

import pytest
import torch
from reference import greedy_dense_prefill, greedy_no_cache

from tss_opt.decoding.drafters import DraftModelDrafter, PromptLookupDrafter, SelfDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.skip import SkipError
from tss_opt.decoding.target import ContextLengthError, TargetModel
from tss_opt.models import ModelConfig, load_model

N_NEW = 40


@pytest.fixture(scope="module")
def prompt(tiny) -> torch.Tensor:
    text = "the cat sat on the mat. the cat sat on the hat. the dog sat on the"
    return tiny.tokenizer(text, return_tensors="pt").input_ids[0]


@pytest.fixture(scope="module")
def draft_lm():
    # A different random model with the same vocabulary: a weak but real draft model.
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=2, seed=7)).model


def drafters(tiny, draft_lm):
    return {
        "none": None,
        "pld": PromptLookupDrafter(num_tokens=6),
        "draft_model": DraftModelDrafter(draft_lm, num_tokens=4),
        "draft_model_same": DraftModelDrafter(tiny.model, num_tokens=4),
        "self": SelfDrafter(tiny.model, skip=[1, 2], num_tokens=3),
    }


@pytest.mark.parametrize("name", ["none", "pld", "draft_model", "draft_model_same", "self"])
def test_dense_equals_hf_generate(tiny, draft_lm, prompt, name):
    ref = tiny.model.generate(prompt[None], max_new_tokens=N_NEW, do_sample=False, eos_token_id=None)
    ref = ref[0, len(prompt) :].tolist()
    engine = SpeculativeEngine(TargetModel(tiny.model), drafters(tiny, draft_lm)[name])
    out = engine.generate(prompt, max_new_tokens=N_NEW)
    assert out.tokens.tolist() == ref
    assert out.stats.new_tokens == N_NEW
    if name == "draft_model_same":  # an identical drafter is always right
        assert out.stats.accept_length > 4.0


@pytest.mark.parametrize("skip", [{0}, {3}, {1, 2}])
@pytest.mark.parametrize("scope", ["all", "verify"])
@pytest.mark.parametrize("name", ["none", "pld", "draft_model", "self"])
def test_sparse_equals_independent_greedy(tiny, draft_lm, prompt, skip, scope, name):
    ref_fn = greedy_no_cache if scope == "all" else greedy_dense_prefill
    ref = ref_fn(tiny.model, prompt, N_NEW, skip)
    dense = greedy_no_cache(tiny.model, prompt, N_NEW)
    assert ref != dense, "the skip set must change the output, or this test proves nothing"
    engine = SpeculativeEngine(TargetModel(tiny.model), drafters(tiny, draft_lm)[name])
    out = engine.generate(prompt, max_new_tokens=N_NEW, skip=skip, scope=scope)
    assert out.tokens.tolist() == ref


def test_stats_without_drafter(tiny, prompt):
    out = SpeculativeEngine(TargetModel(tiny.model)).generate(prompt, max_new_tokens=10, skip={1})
    s = out.stats
    assert s.accept_length == 1.0
    assert s.steps == 9 and s.step_tokens == 9  # the first token comes from the prefill
    assert s.verify_layer_forwards == 9 * 3  # 4 layers, one skipped
    assert s.prefill_layer_forwards == 4  # scope "verify": dense prefill
    assert s.draft_proposed == 0 and s.new_tokens == 10


def test_a_requests_cache_appends_in_place(tiny, prompt):
    """Every running layer's keys live in one buffer sized to the request from the prefill on:
    the steps write into it (same storage) instead of concatenating a new tensor each time."""
    from tss_opt.decoding.cache import InPlaceLayer, request_capacity
    from tss_opt.decoding.tree import DraftTree

    engine = SpeculativeEngine(TargetModel(tiny.model))
    req = engine.prefill(prompt, 8, frozenset({1}), "verify", 0.0, None)
    layers = req.cache.layers
    assert all(isinstance(layer, InPlaceLayer) and layer.capacity == request_capacity(len(prompt), 8) for layer in layers)
    storage = [layer.keys.untyped_storage().data_ptr() for layer in layers]
    with engine.target.skip({1}):
        for _ in range(3):
            tree = DraftTree.empty()
            logits, hidden = engine.verify(req, tree)
            accepted, committed = engine.accept(req, tree, logits)
            engine.commit(req, tree, accepted, committed, logits, hidden)
    assert [layer.keys.untyped_storage().data_ptr() for layer in layers] == storage
    assert [layer.get_seq_length() for layer in layers] == [len(prompt) + 3 if i != 1 else len(prompt) for i in range(4)]


def test_stats_count_accepted_drafts(tiny, prompt):
    engine = SpeculativeEngine(TargetModel(tiny.model), DraftModelDrafter(tiny.model, num_tokens=4))
    s = engine.generate(prompt, max_new_tokens=21).stats
    assert s.steps == 4 and s.step_tokens == 20  # 4 accepted + 1 bonus per step
    assert s.accept_length == 5.0
    assert s.draft_proposed == 16 and s.draft_accepted == 16


def test_stops_at_eos(tiny, prompt):
    ref = greedy_no_cache(tiny.model, prompt, N_NEW)
    eos = ref[5]
    out = SpeculativeEngine(TargetModel(tiny.model), PromptLookupDrafter(), eos_token_ids=[eos]).generate(
        prompt, max_new_tokens=N_NEW
    )
    assert out.tokens.tolist() == ref[: ref.index(eos) + 1]


class _Boom(PromptLookupDrafter):
    def propose(self, context):
        raise RuntimeError("drafter failed")


def test_model_is_dense_after_exception(tiny, prompt):
    target = TargetModel(tiny.model)
    with pytest.raises(RuntimeError, match="drafter failed"):
        SpeculativeEngine(target, _Boom()).generate(prompt, max_new_tokens=5, skip={0, 1})
    assert target.skipper.active == frozenset()
    assert all("forward" not in layer.__dict__ for layer in target.skipper.layers)
    dense = tiny.model.generate(prompt[None], max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert greedy_no_cache(tiny.model, prompt, 8) == dense[0, len(prompt) :].tolist()


def test_skip_out_of_range_names_layer_and_range(tiny, prompt):
    engine = SpeculativeEngine(TargetModel(tiny.model))
    with pytest.raises(SkipError, match=r"\[4\].*0\.\.3"):
        engine.generate(prompt, max_new_tokens=3, skip={4})


def test_prompt_longer_than_context_is_a_clear_error(tiny):
    target = TargetModel(tiny.model, max_context=64)
    with pytest.raises(ContextLengthError, match="supports 64"):
        SpeculativeEngine(target).generate(torch.ones(60, dtype=torch.long), max_new_tokens=10)


def test_nested_skip_contexts_restore(tiny):
    target = TargetModel(tiny.model)
    with target.skip({0}):
        with target.skip({1, 2}):
            assert target.skipper.active == {1, 2}
        assert target.skipper.active == {0}
    assert target.skipper.active == frozenset()
