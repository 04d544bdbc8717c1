"""The held-out report of a lossy mapping entry, tiny model: the TSS row runs the
entry's relaxed rule (not exact), is labelled LOSSY and shows its metric change beside its
speedup; an exact entry's rows stay as they were; bad input is refused before measuring."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tss_opt.decoding.drafters import PromptLookupDrafter, SelfDrafter
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.mapping import DomainMapping, MappingEntry, MappingError
from tss_opt.report import ReportError, run_heldout, write_report
from tss_opt.report.heldout import compare_domain, entry_verifier

TINY_ID = "tiny-llama-4l-seed0"
RELAXED = {"mode": "diversed", "weight": 0.0, "chosen": "fixed w=0.00", "skip_set": [3],
           "calibration": {"accept_length": 3.0, "metric": 0.0, "metric_change": -0.01}}


def _domain(tmp_path: Path, name: str, metric: str):
    lines = [
        json.dumps({"id": f"{name}{i}", "prompt": f"{name} {i}: the cat sat on the mat {i}", "references": [f"the cat {i}"]})
        for i in range(5)
    ]
    data = tmp_path / f"{name}.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_domain({"name": name, "data": str(data), "metric": metric, "pool_size": 5, "calibration_size": 2,
                        "validation_size": 0, "heldout_size": 3, "max_new_tokens": 8})


def _entry(domain: str, **kw) -> MappingEntry:
    base = dict(
        domain=domain, skip_set=(3,), accept_length=1.2, metric=0.1, metric_name="m", cost=0.6, sparsity=0.25,
        baseline={"accept_length": 1.0, "metric": 0.1, "cost": 1.0}, model=TINY_ID, num_layers=4, drafter="self",
        study={}, selection="min_cost",
    )
    return MappingEntry(**{**base, **kw})


@pytest.fixture(scope="module")
def mapping() -> DomainMapping:
    m = DomainMapping().with_entry(_entry("qa", verification="diversed(w=0)", relaxed=RELAXED))
    return m.with_entry(_entry("translation"))


def _self(tiny):
    return lambda: SelfDrafter(tiny.model, skip=[1, 2], num_tokens=3)


def test_lossy_entry_is_measured_under_its_rule_and_labelled(tiny, mapping, tmp_path):
    domains = [_domain(tmp_path, "qa", "token_f1"), _domain(tmp_path, "translation", "bleu")]
    rep = run_heldout(TargetModel(tiny.model), tiny.tokenizer, _self(tiny), mapping, domains, model_id=TINY_ID,
                      drafter="self", prompts=2, show_progress=False)
    qa, tr = rep.domains
    assert qa.lossy and qa.verification == "diversed(w=0.00)" and qa.tss.verification == "diversed(w=0.00)"
    assert qa.native.verification == "exact"  # native is the dense exact reference
    assert not tr.lossy and tr.tss.verification == "exact"
    # w = 0 keeps every draft token: it must accept more than the exact rule on the same prompts.
    _, exact_tss = compare_domain(TargetModel(tiny.model), tiny.tokenizer, _self(tiny), domains[0], {3}, prompts=2,
                                  show_progress=False)
    assert qa.tss.accept_length > exact_tss.accept_length
    md = write_report(rep, tmp_path / "out")["markdown"].read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| qa | TSS") or line.startswith("| translation | TSS")]
    assert rows[0].startswith("| qa | TSS LOSSY diversed(w=0.00) |")
    assert f"× (LOSSY, Δtoken_f1 {qa.metric_change:+.4f})" in rows[0]
    assert rows[1].startswith("| translation | TSS | {3} |") and "LOSSY" not in rows[1]
    assert "**LOSSY** rows ran the mapping entry's relaxed verification rule" in md
    data = json.loads((tmp_path / "out" / "heldout.json").read_text())
    assert data["domains"]["qa"]["lossy"] is True and data["domains"]["translation"]["lossy"] is False
    tss_row = next(r for r in data["rows"] if r["domain"] == "qa" and r["method"] == "TSS")
    assert tss_row["lossy"] and tss_row["verification"] == "diversed(w=0.00)" and "metric_change" in tss_row


def test_bad_lossy_entries_are_refused_before_measuring(tiny, mapping, tmp_path):
    domains = [_domain(tmp_path, "qa", "token_f1")]
    with pytest.raises(ReportError, match="lossy.*'pld'.*draft_model, eagle, self, t2d"):
        run_heldout(TargetModel(tiny.model), tiny.tokenizer, lambda: PromptLookupDrafter(num_tokens=3), mapping,
                    domains, model_id=TINY_ID, drafter="pld", prompts=2, show_progress=False)
    label_only = mapping.with_entry(replace(mapping.entry_for("qa"), relaxed=None))
    with pytest.raises(MappingError, match="no 'relaxed' settings"):
        entry_verifier(label_only.entry_for("qa"))
    assert entry_verifier(mapping.entry_for("translation")) is None
    assert entry_verifier(mapping.entry_for("qa")).weight == 0.0


def test_controller_serves_a_lossy_entry_under_its_rule_and_other_domains_exact(tiny, mapping):
    from tss_opt.runtime import TSSController

    target = TargetModel(tiny.model)
    served = TSSController(target, tiny.tokenizer, mapping, _self(tiny), (), model_id=TINY_ID, max_new_tokens=12)
    qa, tr = served.generate("the cat sat on the mat", "qa"), served.generate("the cat sat on the mat", "translation")
    assert qa.stats.lossy and qa.stats.verification == "diversed(w=0.00)"
    assert not tr.stats.lossy and tr.stats.verification == "exact"
    exact = TSSController(target, tiny.tokenizer, mapping, _self(tiny), (), model_id=TINY_ID, max_new_tokens=12,
                          entry_rules=False)
    plain = exact.generate("the cat sat on the mat", "qa")
    assert not plain.stats.lossy
    # w = 0 keeps every draft token: it accepts at least as much as exact on the same request.
    assert qa.stats.accept_length >= plain.stats.accept_length
