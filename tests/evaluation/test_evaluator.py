"""The trial evaluator: (A, M, C) from real decoding and real metrics."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tss_opt.config import config_dir
from tss_opt.evaluation.cost import analytic_cost
from tss_opt.evaluation.decoding.drafters import PromptLookupDrafter
from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator


def _domain(name: str):
    return load_domain(OmegaConf.load(config_dir() / "domain" / f"{name}.yaml"))


def _evaluator(loaded, domain_name: str, n: int, max_new: int, **kw) -> SpecDecodeEvaluator:
    dom = _domain(domain_name)
    return SpecDecodeEvaluator(
        TargetModel(loaded.model),
        loaded.tokenizer,
        lambda: PromptLookupDrafter(num_tokens=5),
        dom.split("calibration")[:n],
        dom.metric,
        extra_metrics=dom.extra_metrics,
        max_new_tokens=max_new,
        show_progress=False,
        **kw,
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
