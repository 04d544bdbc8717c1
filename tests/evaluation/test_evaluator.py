"""The trial evaluator: (A, M, C) from real decoding and real metrics."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tss_opt.config import config_dir
from tss_opt.decoding.drafters import PromptLookupDrafter, TokenRecycleDrafter
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.cost import analytic_cost
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.metrics.repetition import repeated_ngram_share
from tss_opt.evaluation.prompt_set import PromptSet


def _domain(name: str):
    return load_domain(OmegaConf.load(config_dir() / "domain" / f"{name}.yaml"))


def _evaluator(loaded, domain_name: str, n: int, max_new: int, **kw) -> SpecDecodeEvaluator:
    dom = _domain(domain_name)
    prompts = PromptSet.of(dom, dom.split("calibration")[:n], DecodeProtocol(max_new_tokens=max_new, **kw))
    return SpecDecodeEvaluator(
        TargetModel(loaded.model), loaded.tokenizer, lambda: PromptLookupDrafter(num_tokens=5), prompts,
        show_progress=False,
    )


def test_tiny_evaluator_is_reproducible_and_follows_the_contract(tiny):
    ev = _evaluator(tiny, "qa", n=3, max_new=12)
    assert ev.num_layers == 4 and ev.metric_name == "token_f1" and ev.metric_higher_is_better
    a = ev(frozenset())
    b = ev(frozenset())
    for key in ("accept_length", "metric", "cost", "cost_analytic", "cost_measured", "tokens_per_s"):
        assert key in a
    assert a["accept_length"] >= 1.0
    assert (a["accept_length"], a["metric"], a["cost_analytic"]) == (b["accept_length"], b["metric"], b["cost_analytic"])
    assert a["cost"] == a["cost_analytic"] == pytest.approx(analytic_cost(4, 0, a["accept_length"]))


def test_skip_set_changes_cost_and_measured_cost_is_selectable(tiny):
    ev = _evaluator(tiny, "qa", n=2, max_new=10, cost="measured")
    r = ev.evaluate({1, 2})
    assert r.cost == r.cost_measured > 0
    assert r.cost_analytic == pytest.approx((2 / 4) / r.accept_length)
    assert len(r.prompts) == 2 and all(p.new_tokens == 10 for p in r.prompts)
    assert "exact_match" in r.metric_extras


def test_unknown_cost_is_refused(tiny):
    with pytest.raises(ValueError, match="cost='fast'.*analytic, measured"):
        _evaluator(tiny, "qa", n=1, max_new=4, cost="fast")


@pytest.mark.slow
def test_embedded_smoke_summarization(embedded):
    """Summarization, 2 prompts, 16 tokens on SmolLM2: sensible A, ROUGE-L and speed."""
    ev = _evaluator(embedded, "summarization", n=2, max_new=16)
    r = ev.evaluate(frozenset())
    assert 1.0 <= r.accept_length <= 11.0
    assert 0.0 < r.metric <= 1.0  # ROUGE-L of a real summary against the highlights
    assert r.tokens_per_s > 0 and r.new_tokens == 32
    assert all(len(p.output) > 20 for p in r.prompts)


# --- per-prompt figures, prompt subsets, prefill reuse ------------------------------------------

TIMING = {"tokens_per_s"}  # wall-clock figures differ between runs


def _untimed(rows):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def test_per_prompt_is_ordered_and_adds_up_to_the_aggregates(tiny):
    ev = _evaluator(tiny, "qa", n=4, max_new=12)
    assert ev.num_prompts == 4
    ids = [ex.id for ex in ev.examples]
    for skip in (frozenset(), frozenset({1, 2})):
        d = ev(skip)
        rows = d["per_prompt"]
        assert [r["id"] for r in rows] == ids and [r["index"] for r in rows] == [0, 1, 2, 3]
        assert {"accept_length", "metric", "tokens", "repetition"} <= set(rows[0])
        assert d["metric"] == pytest.approx(sum(r["metric"] for r in rows) / 4)
        assert [round(r["metric"], 4) for r in rows] == d["per_prompt_score"]
        pooled = sum(r["accept_length"] * r["steps"] for r in rows) / sum(r["steps"] for r in rows)
        assert d["accept_length"] == pytest.approx(pooled)
        assert sum(r["tokens"] for r in rows) == d["new_tokens"] and d["steps"] == sum(r["steps"] for r in rows)
    res = ev.evaluate(frozenset({1, 2}))
    for p in res.prompts:
        assert len(p.token_ids) == p.new_tokens
        assert p.repetition == repeated_ngram_share(p.token_ids)
        assert p.output == tiny.tokenizer.decode(list(p.token_ids), skip_special_tokens=True)
    # the tiny random model loops, so the score is informative here
    assert any(p.repetition > 0 for p in res.prompts)


def test_prompt_ids_give_the_full_runs_entries(tiny):
    ev = _evaluator(tiny, "qa", n=4, max_new=12)
    skip = frozenset({2})
    full = ev(skip)["per_prompt"]
    sub = ev(skip, prompt_ids=[3, 1])
    assert _untimed(sub["per_prompt"]) == _untimed([full[3], full[1]])
    assert sub["metric"] == pytest.approx((full[3]["metric"] + full[1]["metric"]) / 2)
    assert sub["new_tokens"] == full[3]["tokens"] + full[1]["tokens"]
    assert _untimed(ev(skip, prompt_ids=None)["per_prompt"]) == _untimed(full)


def test_chunks_in_order_equal_one_call_for_a_learning_drafter(tiny):
    """Token Recycling learns across prompts: chunk calls 0-1, 2-3 continue one drafter."""
    dom = _domain("qa")
    ev = SpecDecodeEvaluator(
        TargetModel(tiny.model), tiny.tokenizer, lambda: TokenRecycleDrafter(top_k=8),
        PromptSet(dom.split("calibration")[:4], dom.metric, DecodeProtocol(max_new_tokens=12)), show_progress=False,
    )
    full = _untimed(ev(frozenset({1}))["per_prompt"])
    chunks = _untimed(ev(frozenset({1}), prompt_ids=[0, 1])["per_prompt"])
    chunks += _untimed(ev(frozenset({1}), prompt_ids=[2, 3])["per_prompt"])
    assert chunks == full


def test_bad_prompt_ids_are_refused(tiny):
    ev = _evaluator(tiny, "qa", n=3, max_new=4)
    with pytest.raises(ValueError, match=r"prompt_ids \[3, -1\] are outside 0..2; the evaluator has 3 prompts"):
        ev(frozenset(), prompt_ids=[0, 3, -1])
    with pytest.raises(ValueError, match=r"prompt_ids repeats \[1\]"):
        ev(frozenset(), prompt_ids=[1, 1])
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        ev(frozenset(), prompt_ids=[])


def test_prefill_reuse_is_lossless_and_only_in_verify_scope(tiny):
    reuse = _evaluator(tiny, "qa", n=3, max_new=12)
    plain = _evaluator(tiny, "qa", n=3, max_new=12, reuse_prefill=False)
    for skip in (frozenset(), frozenset({0}), frozenset({1, 3})):
        assert _untimed(reuse(skip)["per_prompt"]) == _untimed(plain(skip)["per_prompt"])
    assert sorted(reuse._prefills) == [0, 1, 2] and not plain._prefills
    all_scope = _evaluator(tiny, "qa", n=2, max_new=8, scope="all")
    all_scope(frozenset({1}))
    assert not all_scope._prefills  # the prefill skips layers under "all": nothing to share


def test_chunked_trial_equals_one_call_on_every_pooled_figure(tiny):
    """The search's chunked evaluation (early stopping) reports what one call over all prompts
    reports: accepted length and costs pooled over committed tokens, totals summed."""
    from tss_opt.search.chunked import ChunkedRun, drive

    ev = _evaluator(tiny, "qa", n=6, max_new=12)
    skip = frozenset({2})
    one = ev(skip)
    chunked = drive(ev, ChunkedRun(skip, num_prompts=6, chunk=2))
    m, extras = chunked.measurement, chunked.extras
    assert m.accept_length == pytest.approx(one["accept_length"], rel=1e-9)
    assert m.cost == pytest.approx(one["cost"], rel=1e-9)
    assert m.metric == pytest.approx(one["metric"], rel=1e-9)
    assert extras["cost_analytic"] == pytest.approx(one["cost_analytic"], rel=1e-9)
    assert (extras["new_tokens"], extras["steps"]) == (one["new_tokens"], one["steps"])
