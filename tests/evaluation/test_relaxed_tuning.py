"""Per-domain settings of relaxed verification (issue 13): the DIVERSED weight search, CoSpec
REINFORCE, the config/assembly wiring and the lossy labels (tiny model, a few prompts)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tss_opt.assembly import build_verifier, compose_config, protocol
from tss_opt.config import config_dir
from tss_opt.evaluation.decoding.arbitration import LogisticPolicy, ThresholdPolicy
from tss_opt.evaluation.decoding.drafters import SelfDrafter
from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.decoding.verification import RelaxedVerificationError, Verifier
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.relaxed import search_weight, train_cospec_policy


def _evaluator(tiny, n=3, max_new=12, **kw) -> SpecDecodeEvaluator:
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))
    return SpecDecodeEvaluator(
        TargetModel(tiny.model),
        tiny.tokenizer,
        lambda: SelfDrafter(tiny.model, skip=[1, 2], num_tokens=3),
        dom.split("calibration")[:n],
        dom.metric,
        max_new_tokens=max_new,
        show_progress=False,
        **kw,
    )


def test_search_weight_tries_the_grid_and_reports(tiny):
    ev = _evaluator(tiny)
    out = search_weight(ev, frozenset({3}), weights=(1.0, 0.3, 0.0), eps=0.5)
    assert [r["weight"] for r in out.rows] == [1.0, 0.3, 0.0]
    assert out.weight in (1.0, 0.3, 0.0)
    assert ev.verifier.describe() == "exact"  # restored
    with pytest.raises(RelaxedVerificationError, match=r"\[0, 1\]"):
        search_weight(ev, weights=(1.2,))


def test_lossy_results_say_so(tiny):
    r = _evaluator(tiny, n=2, verification=Verifier("diversed", weight=0.0)).evaluate(frozenset())
    assert r.lossy and r.to_dict()["verification"] == "diversed(w=0.00)" and r.to_dict()["lossy"] is True
    assert not _evaluator(tiny, n=2).evaluate(frozenset()).lossy


def test_reinforce_runs_and_updates_the_policy(tiny):
    ev = _evaluator(tiny, n=3)
    start = LogisticPolicy()
    start.theta[0] = 0.0  # keeps half the time: both actions are explored
    theta0 = start.theta.clone()
    out = train_cospec_policy(ev, epochs=2, policy=start, step_cost=1.0)
    assert len(out.history) == 2 and not out.policy.training
    assert not bool((out.policy.theta == theta0).all())
    assert 0.0 < out.history[0]["keep_rate"] < 1.0


def test_config_builds_the_verifier_and_refuses_pld():
    cfg = compose_config(["+domain=summarization", "verification=diversed", "relaxed.weight=0.7", "drafter=self",
                          "drafter.skip=[1]"])
    v = build_verifier(cfg)
    assert v.lossy and v.weight == 0.7
    assert protocol(cfg)["verification"] == "diversed(w=0.7)"
    exact = compose_config(["+domain=summarization"])
    # Exact verification (the default) adds no protocol key, so earlier study names still match.
    assert "verification" not in protocol(exact) and not build_verifier(exact).lossy
    cs = build_verifier(compose_config(["verification=cospec", "drafter=self", "drafter.skip=[1]"]))
    assert isinstance(cs.policy, ThresholdPolicy)
    for mode in ("diversed", "cospec"):
        with pytest.raises(RelaxedVerificationError, match="'pld'.*draft_model, self"):
            build_verifier(compose_config([f"verification={mode}", "drafter=pld"]))
    with pytest.raises(RelaxedVerificationError, match=r"\[0, 1\]"):
        build_verifier(compose_config(["verification=diversed", "relaxed.weight=2", "drafter=self", "drafter.skip=[1]"]))
    with pytest.raises(Exception) as err:  # Hydra's own error; the cause lists the options
        compose_config(["verification=lenient"])
    assert "exact" in repr(err.value.__cause__) or "exact" in str(err.value.__cause__)


def test_mapping_entry_keeps_the_lossy_label():
    from tss_opt.mapping.format import MappingEntry, _entry

    e = MappingEntry(
        domain="qa", skip_set=(1,), accept_length=2.0, metric=0.2, metric_name="f1", cost=0.5, sparsity=0.25,
        baseline={"accept_length": 1.5, "metric": 0.25, "cost": 0.7}, model="m", num_layers=4, drafter="self",
        study={}, selection="min_cost", verification="diversed(w=0.6)",
    )
    d = e.to_dict()
    assert d["lossy"] is True and d["verification"] == "diversed(w=0.6)" and d["metric_change"] == pytest.approx(-0.05)
    back = _entry(None, "qa", d, "m", 4)
    assert back.verification == "diversed(w=0.6)" and back.lossy
    plain = MappingEntry(**{**e.__dict__, "verification": "exact"}).to_dict()
    assert "verification" not in plain and not _entry(None, "qa", plain, "m", 4).lossy
