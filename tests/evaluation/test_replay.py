"""The replay evaluator equals the engine evaluator: per-prompt outputs and accepted lengths.

Tiny random Llama in float64 (no near-ties), every replayable drafter, dense and sparse, both
scopes, a skip set with layer 0 (FACTS.md: the layer-0 cache pitfall), batch sizes that pad;
the embedded model in float32 (slow).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.config import config_dir
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.drafters import (
    DraftModelDrafter,
    EagleDrafter,
    PromptLookupDrafter,
    SamdDrafter,
    SelfDrafter,
    TokenRecycleDrafter,
    random_eagle_head,
)
from tss_opt.decoding.engine import NoDrafter, SpeculativeEngine
from tss_opt.decoding.greedy import BatchGreedy
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.evaluation.replay import ReplayError, ReplayEvaluator, replay_stats
from tss_opt.models import ModelConfig, load_model

MAX_NEW = 14
EOS = (258,)
COMPARED = ("index", "id", "accept_length", "metric", "tokens", "steps", "repetition")


@pytest.fixture(scope="module")
def draft64():
    return load_model(ModelConfig(name="tiny_draft", source="tiny", num_layers=2, seed=1, dtype="float64"))


@pytest.fixture(scope="module")
def qa():
    return load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))


def _drafters(tiny64, draft64):
    head = random_eagle_head(tiny64.model, seed=0)
    return {
        "pld": lambda: PromptLookupDrafter(num_tokens=5),
        "samd": lambda: SamdDrafter(threshold=2, num_tokens=6, fallback=NoDrafter()),
        "draft_model": lambda: DraftModelDrafter(draft64.model, num_tokens=3),
        "self": lambda: SelfDrafter(tiny64.model, skip=[1, 2], num_tokens=3),
        "eagle": lambda: EagleDrafter(head, total_tokens=12, depth=4, top_k=3),
    }


def _pair(loaded, dom, factory, scope, n=4, batch_size=3, **kw):
    target = TargetModel(loaded.model)
    prompts = PromptSet(
        dom.split("calibration")[:n], dom.metric, DecodeProtocol(max_new_tokens=MAX_NEW, scope=scope, eos_token_ids=EOS, **kw)
    )
    engine = SpecDecodeEvaluator(target, loaded.tokenizer, factory, prompts, show_progress=False)
    replay = ReplayEvaluator(target, loaded.tokenizer, factory, prompts, batch_size=batch_size, show_progress=False)
    return engine, replay


def _rows(result):
    return [{k: row[k] for k in COMPARED} for row in result["per_prompt"]]


@pytest.mark.parametrize("name", ["pld", "samd", "draft_model", "self", "eagle"])
@pytest.mark.parametrize("scope", ["verify", "all"])
def test_replay_equals_engine_for_every_drafter(tiny64, draft64, qa, name, scope):
    engine, replay = _pair(tiny64, qa, _drafters(tiny64, draft64)[name], scope)
    for skip in (frozenset(), frozenset({0}), frozenset({1, 3})):
        e, r = engine.evaluate(skip), replay.evaluate(skip)
        assert [p.token_ids for p in r.prompts] == [p.token_ids for p in e.prompts], (name, scope, sorted(skip))
        assert [p.output for p in r.prompts] == [p.output for p in e.prompts]
        assert _rows(r.to_dict()) == _rows(e.to_dict()), (name, scope, sorted(skip))
        for key in ("accept_length", "metric", "cost", "cost_analytic", "new_tokens", "steps"):
            assert r.to_dict()[key] == e.to_dict()[key], key
        # the drafter really drafted: some step accepted a candidate
        if name in ("pld", "self", "eagle") and not skip:
            assert e.accept_length > 1.0


def test_dense_without_drafter_is_plain_decoding(tiny64, qa):
    engine, replay = _pair(tiny64, qa, lambda: None, "verify")
    e, r = engine(frozenset({2})), replay(frozenset({2}))
    assert _rows(r) == _rows(e) and r["accept_length"] == 1.0


@pytest.mark.parametrize("scope", ["verify", "all"])
def test_padding_batch_size_and_prompt_ids_do_not_change_results(tiny64, draft64, qa, scope):
    factory = _drafters(tiny64, draft64)["eagle"]
    _, one = _pair(tiny64, qa, factory, scope, n=5, batch_size=1)
    _, five = _pair(tiny64, qa, factory, scope, n=5, batch_size=5)
    lens = {int(p.numel()) for p in five.prompt_tokens}
    assert len(lens) > 1  # the batch really pads
    skip = frozenset({0, 2})
    full = _rows(five(skip))
    assert _rows(one(skip)) == full
    sub = five(skip, prompt_ids=[4, 1, 2])
    assert _rows(sub) == [full[4], full[1], full[2]]
    assert five.num_prompts == 5


def test_prefill_reuse_is_lossless(tiny64, qa):
    _, reuse = _pair(tiny64, qa, lambda: PromptLookupDrafter(num_tokens=5), "verify")
    _, plain = _pair(tiny64, qa, lambda: PromptLookupDrafter(num_tokens=5), "verify", reuse_prefill=False)
    for skip in (frozenset(), frozenset({0}), frozenset({1, 3})):
        assert _rows(reuse(skip)) == _rows(plain(skip))
    assert reuse._prefills and not plain._prefills


def test_the_generation_with_layer_zero_skipped_equals_single_prompt_runs(tiny64, qa):
    target = TargetModel(tiny64.model)
    _, replay = _pair(tiny64, qa, lambda: None, "all", n=3)
    prompts = replay.prompt_tokens
    (batch,) = BatchGreedy(target)(prompts, [frozenset({0, 3})], max_new_tokens=MAX_NEW, scope="all")
    for p, g in zip(prompts, batch, strict=True):
        res = SpeculativeEngine(target).generate(p, max_new_tokens=MAX_NEW, skip={0, 3}, scope="all")
        assert g.tokens == res.tokens.tolist()


def test_replay_stats_on_the_engines_output_equal_its_stats(tiny64, qa):
    """The accounting alone: replaying pld over the engine's own output gives its statistics."""
    target = TargetModel(tiny64.model)
    _, replay = _pair(tiny64, qa, lambda: None, "verify")
    for p in replay.prompt_tokens:
        res = SpeculativeEngine(target, PromptLookupDrafter(num_tokens=5), eos_token_ids=EOS).generate(
            p, max_new_tokens=MAX_NEW, skip={1}
        )
        s = replay_stats(PromptLookupDrafter(num_tokens=5), p, res.tokens.tolist(), max_new_tokens=MAX_NEW,
                         eos_token_ids=EOS)
        got = (s.steps, s.step_tokens, s.new_tokens, s.draft_proposed, s.draft_accepted)
        want = (res.stats.steps, res.stats.step_tokens, res.stats.new_tokens, res.stats.draft_proposed,
                res.stats.draft_accepted)
        assert got == want


# --- refusals -----------------------------------------------------------------------------------

def test_token_recycling_and_samd_with_its_fallback_are_refused(tiny64, qa):
    with pytest.raises(ReplayError, match="cannot reproduce Token Recycling.*evaluator=engine"):
        _pair(tiny64, qa, lambda: TokenRecycleDrafter(), "verify")
    with pytest.raises(ReplayError, match=r"SAMD's Token Recycling fallback.*\+drafter.fallback=none"):
        _pair(tiny64, qa, lambda: SamdDrafter(), "verify")


def test_unknown_drafter_cost_measured_and_sampling_are_refused(tiny64, qa):
    class Mine(Drafter):
        def propose(self, context):
            raise AssertionError

    with pytest.raises(ReplayError, match="does not know whether drafter Mine can be replayed"):
        _pair(tiny64, qa, Mine, "verify")
    with pytest.raises(ReplayError, match="cost='measured' cannot be used with evaluator=replay.*cost=analytic"):
        _pair(tiny64, qa, lambda: None, "verify", cost="measured")
    with pytest.raises(ReplayError, match="temperature=0.7 .*only greedy"):
        _pair(tiny64, qa, lambda: None, "verify", temperature=0.7)
    with pytest.raises(ReplayError, match="evaluator.batch_size=0"):
        _pair(tiny64, qa, lambda: None, "verify", batch_size=0)


def test_config_group_builds_the_replay_evaluator(tiny64):
    from tss_opt.assembly import Assembly, build_evaluator, compose_config, configured_evaluator

    cfg = compose_config(["evaluator=replay", "evaluator.batch_size=2", "+domain=qa", "drafter=pld",
                          "+model=tiny", "search.prompts=2"])
    assert cfg.evaluator.kind == "replay"
    rt = Assembly(loaded=tiny64, target=TargetModel(tiny64.model), drafter_cfg={"name": "pld"})
    ev = configured_evaluator(cfg, runtime=rt)
    assert isinstance(ev, ReplayEvaluator) and ev.batch_size == 2 and ev.num_prompts == 2
    assert compose_config([]).evaluator.kind == "auto"  # the default
    samd = compose_config(["evaluator=replay", "+domain=qa", "drafter=samd", "+model=tiny", "search.prompts=1"])
    rt = Assembly(loaded=tiny64, target=TargetModel(tiny64.model), drafter_cfg={"name": "samd"})
    with pytest.raises(ReplayError, match="fallback=none"):
        build_evaluator(samd, runtime=rt)
    rt.drafter_cfg = {"name": "samd", "fallback": "none"}
    assert build_evaluator(samd, "replay", runtime=rt).num_prompts == 1


# --- the embedded model -------------------------------------------------------------------------

def _margin(target: TargetModel, prompt: torch.Tensor, prefix: list[int], skip) -> float:
    """Top-1 minus top-2 logit of the target (dense prefill, sparse after) after ``prompt + prefix``."""
    from tss_opt.decoding.tree import DraftTree

    cache = target.new_cache()
    with target.skip(()):
        logits, _ = target.prefill(prompt, cache)
    if prefix:
        with target.skip(skip):
            logits, _ = target.verify_forward(prefix[0], DraftTree.chain(prefix[1:]), cache, int(prompt.numel()))
    top = logits[-1].float().topk(2).values
    return float(top[0] - top[1])


@pytest.mark.slow
def test_embedded_float32_replay_equals_engine(embedded):
    """SmolLM2 in float32, 3 summarization prompts x 12 tokens, pld: equal outputs and A; a
    prompt whose output differs must diverge at a near-tie (named in the message), and the
    replay's accounting on the engine's own output must still give the engine's figures."""
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "summarization.yaml"))
    target = TargetModel(embedded.model)
    ex = dom.split("calibration")[:3]
    eos = list(embedded.tokenizer.convert_tokens_to_ids(["<|im_end|>"]))
    prompts = PromptSet(ex, dom.metric, DecodeProtocol(max_new_tokens=12, eos_token_ids=eos))
    factory = lambda: PromptLookupDrafter(num_tokens=5)  # noqa: E731
    engine = SpecDecodeEvaluator(target, embedded.tokenizer, factory, prompts, show_progress=False)
    replay = ReplayEvaluator(target, embedded.tokenizer, factory, prompts, batch_size=3, show_progress=False)
    for skip in (frozenset(), frozenset({10, 20})):
        e, r = engine.evaluate(skip), replay.evaluate(skip)
        for pe, pr in zip(e.prompts, r.prompts, strict=True):
            prompt = engine.prompt_tokens[pe.index]
            s = replay_stats(factory(), prompt, list(pe.token_ids), max_new_tokens=12, eos_token_ids=eos)
            assert (s.steps, s.step_tokens) == (pe.steps, round(pe.accept_length * pe.steps))
            if pe.token_ids == pr.token_ids:
                assert (pr.accept_length, pr.steps, pr.score) == (pe.accept_length, pe.steps, pe.score)
                continue
            k = next(i for i, (a, b) in enumerate(zip(pe.token_ids, pr.token_ids)) if a != b)
            margin = _margin(target, prompt, list(pe.token_ids[:k]), skip)
            assert margin < 1e-3, (
                f"prompt {pe.id} (skip {sorted(skip)}) differs at token {k} with a top-2 logit margin of {margin}"
            )


def test_a_replay_labels_its_figures_and_reports_no_decoding_speed(tiny64, qa):
    """The replay's throughput is not a decoding speed, so its answer (what the search
    stores as trial attributes, the dashboard's columns) has no ``tokens_per_s``; the engine's has."""
    engine, replay = _pair(tiny64, qa, lambda: PromptLookupDrafter(num_tokens=5), "verify", n=2)
    e, r = engine(frozenset({1})), replay(frozenset({1}))
    assert (e["evaluator"], r["evaluator"]) == ("engine", "replay")
    assert e["tokens_per_s"] > 0 and "replay_tokens_per_s" not in e
    assert "tokens_per_s" not in r and r["replay_tokens_per_s"] > 0
    assert e["cost_kind"] == r["cost_kind"] == "analytic"
    assert replay.call_group([frozenset(), frozenset({2})])[1]["evaluator"] == "replay"
