"""Grouped trials: several skip sets generated in one batch give, per prompt, what
each set gives alone.

Tiny random Llama in float64 (exact) and float32 (the default dtype; rows compute
independently, so equal here too), skip sets that make every layer all-skip, no-skip and
mixed across the group (layer 0 included: the empty-cache pitfall), both scopes, with and
without the kept dense prefill, a replayable drafter (pld) and one with prefill feedback
(EAGLE). The generation is the batch engine at depth 0: each row equals its request decoded
alone, and a row that skips a layer costs that layer nothing.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.config import config_dir
from tss_opt.decoding.drafters import EagleDrafter, PromptLookupDrafter, random_eagle_head
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.greedy import BatchGreedy
from tss_opt.decoding.prefill import dense_prefill
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.evaluation.replay import ReplayEvaluator
from tss_opt.models import ModelConfig, load_model

MAX_NEW = 12
EOS = (258,)
COMPARED = ("index", "id", "accept_length", "metric", "tokens", "steps", "repetition")
# Across the group every layer is skipped by some sets and not others ("mixed"), layer 0 too.
GROUP = (frozenset(), frozenset({0}), frozenset({1, 3}), frozenset({0, 2, 3}), frozenset({1}))


@pytest.fixture(scope="module")
def qa():
    return load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))


@pytest.fixture(scope="module", params=["float64", "float32"])
def tiny_dtype(request):
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype=request.param))


def _evaluator(loaded, dom, factory, scope, *, n=5, batch_size=3, **kw):
    target = TargetModel(loaded.model)
    prompts = PromptSet(
        dom.split("calibration")[:n], dom.metric, DecodeProtocol(max_new_tokens=MAX_NEW, scope=scope, eos_token_ids=EOS, **kw)
    )
    return ReplayEvaluator(target, loaded.tokenizer, factory, prompts, batch_size=batch_size, show_progress=False)


def _rows(result):
    return [{k: row[k] for k in COMPARED} for row in result.to_dict()["per_prompt"]]


@pytest.mark.parametrize("scope", ["verify", "all"])
@pytest.mark.parametrize("drafter", ["pld", "eagle"])
def test_group_equals_one_at_a_time(tiny_dtype, qa, scope, drafter):
    if drafter == "eagle":
        head = random_eagle_head(tiny_dtype.model, seed=0)

        def factory():
            return EagleDrafter(head, total_tokens=10, depth=3, top_k=3)
    else:

        def factory():
            return PromptLookupDrafter(num_tokens=4)

    ev = _evaluator(tiny_dtype, qa, factory, scope)
    alone = [ev.evaluate(s) for s in GROUP]
    grouped = ev.evaluate_group(GROUP)
    assert len(grouped) == len(GROUP)
    for s, a, g in zip(GROUP, alone, grouped, strict=True):
        assert g.skip == s
        assert [p.token_ids for p in g.prompts] == [p.token_ids for p in a.prompts], sorted(s)
        assert _rows(g) == _rows(a), sorted(s)
        for key in ("accept_length", "metric", "cost", "cost_analytic", "new_tokens", "steps"):
            assert g.to_dict()[key] == a.to_dict()[key], (sorted(s), key)
    # the sets really differ (else the group would prove nothing)
    assert len({tuple(p.token_ids for p in a.prompts) for a in alone}) > 2
    # a subset of prompts, in another order, grouped: the same per-prompt rows
    sub = ev.evaluate_group(GROUP[1:3], prompt_ids=[4, 0, 2])
    for a, g in zip(alone[1:3], sub, strict=True):
        full = _rows(a)
        assert _rows(g) == [full[4], full[0], full[2]]


def test_group_without_kept_prefill_equals_with(tiny_dtype, qa):
    def factory():
        return PromptLookupDrafter(num_tokens=4)

    kept = _evaluator(tiny_dtype, qa, factory, "verify")
    plain = _evaluator(tiny_dtype, qa, factory, "verify", reuse_prefill=False)
    a, b = kept.evaluate_group(GROUP), plain.evaluate_group(GROUP)
    assert [_rows(x) for x in a] == [_rows(x) for x in b]
    assert kept._prefills and not plain._prefills
    # the kept prefill was not changed by the grouped run: a single trial afterwards still equals
    assert _rows(kept.evaluate(GROUP[2])) == _rows(a[2])


@pytest.mark.parametrize("scope", ["verify", "all"])
def test_grouped_generation_rows_equal_each_request_alone(qa, scope):
    tiny64 = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))
    target = TargetModel(tiny64.model)
    prompts = _evaluator(tiny64, qa, lambda: None, scope, n=3).prompt_tokens
    prefills = [dense_prefill(target, p) for p in prompts] if scope == "verify" else None
    source = BatchGreedy(target)
    groups = source(prompts, GROUP, max_new_tokens=MAX_NEW, scope=scope, keep_hidden=True, prefills=prefills)
    for s, gens in zip(GROUP, groups, strict=True):
        (alone,) = source(prompts, [s], max_new_tokens=MAX_NEW, scope=scope, keep_hidden=True)
        for p, g, a in zip(prompts, gens, alone, strict=True):
            want = SpeculativeEngine(target).generate(p, max_new_tokens=MAX_NEW, skip=s, scope=scope)
            assert g.tokens == a.tokens == want.tokens.tolist(), sorted(s)
            assert g.features.shape == (int(p.numel()) + len(g.tokens) - 1, tiny64.model.config.hidden_size)
            torch.testing.assert_close(g.features, a.features, rtol=0, atol=1e-12)
            torch.testing.assert_close(g.prefill_logits, a.prefill_logits, rtol=0, atol=1e-12)


def test_a_row_that_skips_a_layer_costs_that_layer_nothing(qa):
    """One model runner for the server and the replay: a grouped generation runs layer ``l``
    only on the tokens of the rows whose skip set does not hold ``l`` (the masked batch it
    replaces ran every mixed layer on every row)."""
    tiny64 = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))
    target = TargetModel(tiny64.model)
    prompts = _evaluator(tiny64, qa, lambda: None, "verify", n=2).prompt_tokens
    prefills = [dense_prefill(target, p) for p in prompts]
    seen: dict[int, list[int]] = {i: [] for i in range(target.num_layers)}
    hooks = [
        layer.mlp.register_forward_hook(lambda m, args, out, i=i: seen[i].append(int(args[0].shape[1])))
        for i, layer in enumerate(target.skipper.layers)
    ]
    try:
        BatchGreedy(target)(prompts, GROUP, max_new_tokens=MAX_NEW, prefills=prefills)
    finally:
        for h in hooks:
            h.remove()
    rows = len(GROUP) * len(prompts)
    for layer, sizes in seen.items():
        running = sum(layer not in s for s in GROUP) * len(prompts)
        # every step while all rows decode runs the layer on one token per running row
        assert sizes[0] == running < rows, (layer, sizes[:3])
        assert max(sizes) == running
