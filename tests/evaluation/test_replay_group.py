"""Grouped trials: several skip sets generated in one batch give, per prompt, what
each set gives alone.

Tiny random Llama in float64 (exact) and float32 (the default dtype; rows compute
independently, so equal here too), skip sets that make every layer all-skip, no-skip and
mixed across the group (layer 0 included: the empty-cache pitfall), both scopes, with and
without the kept dense prefill, a replayable drafter (pld) and one with prefill feedback
(EAGLE).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.config import config_dir
from tss_opt.decoding.drafters import EagleDrafter, PromptLookupDrafter, random_eagle_head
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.skip import SkipError
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.evaluation.replay import ReplayEvaluator, batched_greedy, grouped_greedy
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


def test_grouped_greedy_rows_equal_batched_greedy(qa):
    tiny64 = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))
    target = TargetModel(tiny64.model)
    ev = _evaluator(tiny64, qa, lambda: None, "all", n=3)
    prompts = ev.prompt_tokens
    groups = grouped_greedy(target, prompts, GROUP, max_new_tokens=MAX_NEW, scope="all", keep_hidden=True)
    for s, gens in zip(GROUP, groups, strict=True):
        alone = batched_greedy(target, prompts, max_new_tokens=MAX_NEW, skip=s, scope="all", keep_hidden=True)
        assert [g.tokens for g in gens] == [g.tokens for g in alone]
        for g, a in zip(gens, alone, strict=True):
            torch.testing.assert_close(g.features, a.features, rtol=0, atol=1e-12)
            torch.testing.assert_close(g.prefill_logits, a.prefill_logits, rtol=0, atol=1e-12)


def test_apply_rows_counts_forwards_and_restores(qa):
    tiny64 = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))
    target = TargetModel(tiny64.model)
    ctrl = target.skipper
    x = torch.zeros(2, 3, dtype=torch.long)
    before = ctrl.executed_layers
    with target.skip_rows([{0, 1}, {1, 2}]):  # layer 1: all skip; 0, 2: mixed; 3: none
        assert ctrl.active == frozenset({1})
        assert ctrl.active_rows == (frozenset({0, 1}), frozenset({1, 2}))
        target.decoder(input_ids=x)
        assert ctrl.executed_layers - before == 3  # one batched forward per layer that any row runs
        with target.skip({3}):  # nesting: the inner set is in force for all rows
            assert ctrl.active == frozenset({3}) and ctrl.active_rows is None
        with pytest.raises(SkipError, match="batch size 1"):
            target.decoder(input_ids=x[:1])
    assert ctrl.active == frozenset() and ctrl.active_rows is None
    assert all("forward" not in layer.__dict__ for layer in ctrl.layers)
    with pytest.raises(SkipError, match="no rows"):
        with target.skip_rows([]):
            pass
    with pytest.raises(SkipError, match="out of range"):
        with target.skip_rows([{9}]):
            pass
