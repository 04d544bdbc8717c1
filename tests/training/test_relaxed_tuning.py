"""Per-domain settings of relaxed verification: the DIVERSED weight search, CoSpec
REINFORCE, the config/assembly wiring and the lossy labels (tiny model, a few prompts)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.assembly import build_verifier, compose_config, study_protocol
from tss_opt.config import config_dir
from tss_opt.config.schema import RelaxedSettings
from tss_opt.decoding.drafters import SelfDrafter
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.verify.arbitration import FEATURES, LogisticPolicy, ThresholdPolicy
from tss_opt.decoding.verify.relaxed import (
    RelaxedVerificationError,
    Verifier,
    verifier_from_settings,
)
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.search.tolerance import MetricTolerance
from tss_opt.training.relaxed import search_weight, train_cospec_policy


def _evaluator(tiny, n=3, max_new=12, **kw) -> SpecDecodeEvaluator:
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))
    return SpecDecodeEvaluator(
        TargetModel(tiny.model),
        tiny.tokenizer,
        lambda: SelfDrafter(tiny.model, skip=[1, 2], num_tokens=3),
        PromptSet(dom.split("calibration")[:n], dom.metric, DecodeProtocol(max_new_tokens=max_new, **kw)),
        show_progress=False,
    )


def test_search_weight_tries_the_grid_and_reports(tiny):
    ev = _evaluator(tiny)
    out = search_weight(ev, frozenset({3}), RelaxedSettings(weights=[1.0, 0.3, 0.0]), tolerance=MetricTolerance(0.5))
    assert [r["weight"] for r in out.rows] == [1.0, 0.3, 0.0]
    assert out.weight in (1.0, 0.3, 0.0)
    assert ev.verifier.describe() == "exact"  # restored
    with pytest.raises(RelaxedVerificationError, match=r"\[0, 1\]"):
        search_weight(ev, settings=RelaxedSettings(weights=[1.2]))


def test_lossy_results_say_so(tiny):
    r = _evaluator(tiny, n=2, verification=Verifier("diversed", weight=0.0)).evaluate(frozenset())
    assert r.lossy and r.to_dict()["verification"] == "diversed(w=0.00)" and r.to_dict()["lossy"] is True
    assert not _evaluator(tiny, n=2).evaluate(frozenset()).lossy


def test_reinforce_runs_and_updates_the_policy(tiny):
    ev = _evaluator(tiny, n=3)
    start = LogisticPolicy()
    start.theta[0] = 0.0  # keeps half the time: both actions are explored
    theta0 = start.theta.clone()
    out = train_cospec_policy(ev, settings=RelaxedSettings(epochs=2, step_cost=1.0), policy=start)
    assert len(out.history) == 2 and not out.policy.training
    assert not bool((out.policy.theta == theta0).all())
    assert 0.0 < out.history[0]["keep_rate"] < 1.0


def test_config_builds_the_verifier_and_refuses_pld():
    cfg = compose_config(["+domain=summarization", "verification=diversed", "relaxed.weight=0.7", "drafter=self",
                          "drafter.skip=[1]"])
    v = build_verifier(cfg)
    assert v.lossy and v.weight == 0.7
    assert study_protocol(cfg).identity()["verification"] == "diversed(w=0.7)"
    exact = compose_config(["+domain=summarization"])
    # Exact verification (the default) adds no protocol key, so earlier study names still match.
    assert "verification" not in study_protocol(exact).identity() and not build_verifier(exact).lossy
    cs = build_verifier(compose_config(["verification=cospec", "drafter=self", "drafter.skip=[1]"]))
    assert isinstance(cs.policy, ThresholdPolicy)
    for mode in ("diversed", "cospec"):
        with pytest.raises(RelaxedVerificationError, match="'pld'.*draft_model, eagle, self"):
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


# ------------------------------------------------------------- learned DIVERSED weight
def test_diversed_weight_reinforce_runs_and_changes_theta(tiny):
    from tss_opt.training.relaxed import train_diversed_weight

    ev = _evaluator(tiny, n=3)
    out = train_diversed_weight(
        ev, frozenset({3}), RelaxedSettings(epochs=2, init_weight=0.5, step_cost=1.0, seed=1)
    )
    assert len(out.history) == 2 and not out.policy.training and out.policy.episodes == []
    assert out.history[0]["decisions"] > 0 and 0.0 < out.history[0]["mean_weight"] < 1.0
    start = torch.zeros(len(FEATURES), dtype=torch.float64)
    assert not bool((out.policy.theta[1:] == start[1:]).all()), "REINFORCE left theta where it started"
    assert ev.verifier.describe() == "exact"  # restored


def _judged(a: float, feasible: bool):
    from tss_opt.training.relaxed import Judged

    return Judged("x", a, 0.5, 0.0, 0.0, 0.01, feasible, None)  # type: ignore[arg-type]


def test_choice_rule_prefers_exact_on_ties_and_falls_back_to_it():
    from tss_opt.training.relaxed_choice import Candidate, _choose

    exact = Candidate("exact", "exact", {}, _judged(2.0, True))
    tie = Candidate("fixed w=0.60", "diversed", {"weight": 0.6}, _judged(2.0, True))
    better = Candidate("learned weight", "diversed", {"weight_policy": "p.json"}, _judged(2.5, True))
    broken = Candidate("fixed w=0.20", "diversed", {"weight": 0.2}, _judged(3.0, False))
    assert _choose([exact, tie]) is exact
    assert _choose([exact, tie, better, broken]) is better
    assert _choose([Candidate("exact", "exact", {}, _judged(2.0, False)), broken]).name == "exact"
    assert better.label == "diversed(weight_policy=p.json)" and tie.label == "diversed(w=0.6)"


@pytest.mark.parametrize("mode", ["diversed", "cospec"])
def test_tune_relaxed_judges_every_candidate(tiny, tmp_path, mode):
    from tss_opt.training.relaxed_choice import tune_relaxed

    ev = _evaluator(tiny, n=3, max_new=8)
    choice = tune_relaxed(
        ev, mode, frozenset({3}), RelaxedSettings(weights=[1.0, 0.0], epochs=1), tolerance=MetricTolerance(0.5)
    )
    names = [c.name for c in choice.candidates]
    assert names == (["exact", "fixed w=0.00", "learned weight"] if mode == "diversed" else
                     ["exact", "threshold", "learned policy"])
    saved = choice.save_learned(tmp_path, "qa")
    assert set(saved) == {names[-1]} and saved[names[-1]].is_file()
    assert choice.candidates[-1].settings[("weight_policy" if mode == "diversed" else "policy")] == str(saved[names[-1]])
    table = choice.table("f1")
    assert table.count("\n") == 1 + len(names) and "**yes**" in table
    block = choice.mapping_block()
    if choice.lossy:
        assert block["mode"] == mode and block["chosen"] == choice.chosen.name and block["skip_set"] == [3]
        assert block["calibration"]["prompts"] == 3 and len(block["candidates"]) == len(names)
        # the rule under the configuration's names (search.eps_metric, ...), one value
        assert {k: block["calibration"][k] for k in ("eps_metric", "relative", "eps_metric_abs", "confidence")} == {
            "eps_metric": 0.5, "relative": True, "eps_metric_abs": 0.005, "confidence": 0.8,
        }
        assert verifier_from_settings(block["mode"], block).lossy  # the block rebuilds the rule
    else:
        assert block is None
    with pytest.raises(RelaxedVerificationError, match="lossy mode"):
        tune_relaxed(ev, "exact")


def test_config_builds_the_learned_weight(tmp_path):
    from tss_opt.assembly import study_identity
    from tss_opt.decoding.verify.blend_weight import LearnedWeight

    path = LearnedWeight().save(tmp_path / "w.json")
    cfg = compose_config(["+domain=summarization", "verification=diversed", f"relaxed.weight_policy={path}",
                          "drafter=self", "drafter.skip=[1]"])
    v = build_verifier(cfg)
    assert isinstance(v.weight_policy, LearnedWeight) and v.describe() == "diversed(w=learned)"
    assert study_protocol(cfg).identity()["verification"] == f"diversed(weight_policy={path})"
    _, meta = study_identity(cfg)
    assert meta["lossy"] is True and meta["relaxed"]["weight_policy"] == str(path) and meta["relaxed"]["mode"] == "diversed"
    _, exact_meta = study_identity(compose_config(["+domain=summarization"]))
    assert "lossy" not in exact_meta and "relaxed" not in exact_meta  # exact studies' metadata unchanged
    eagle = compose_config(["verification=diversed", "drafter=eagle", "drafter.random_init=true"])
    assert build_verifier(eagle).lossy  # EAGLE gives distributions now


def test_mapping_entry_keeps_the_tuned_setting():
    from tss_opt.mapping.format import MappingEntry, MappingError, _entry

    base = dict(
        domain="qa", skip_set=(1,), accept_length=2.0, metric=0.2, metric_name="f1", cost=0.5, sparsity=0.25,
        baseline={"accept_length": 1.5, "metric": 0.25, "cost": 0.7}, model="m", num_layers=4, drafter="self",
        study={}, selection="min_cost",
    )
    relaxed = {"mode": "cospec", "policy": "storage/relaxed/x.json", "calibration": {"metric": 0.24, "metric_change": -0.01}}
    e = MappingEntry(**base, verification="cospec(policy=storage/relaxed/x.json)", relaxed=relaxed)
    d = e.to_dict()
    # metric_change is the tuned rule's, not the search's (exact under the skip set)
    assert d["lossy"] and d["relaxed"]["policy"] == "storage/relaxed/x.json" and d["metric_change"] == -0.01
    back = _entry(None, "qa", d, "m", 4)
    assert back.relaxed == relaxed and back.lossy
    exact = MappingEntry(**base).to_dict()
    assert "relaxed" not in exact and "lossy" not in exact  # exact entries are written as before
    with pytest.raises(MappingError, match="relaxed.mode"):
        _entry(None, "qa", {**d, "relaxed": {"mode": "lenient"}}, "m", 4)
    with pytest.raises(MappingError, match=r"relaxed.weight.*\[0, 1\]"):
        _entry(None, "qa", {**d, "relaxed": {"mode": "diversed", "weight": 3}}, "m", 4)
    with pytest.raises(MappingError, match="verification is exact"):
        _entry(None, "qa", {**exact, "relaxed": relaxed}, "m", 4)
