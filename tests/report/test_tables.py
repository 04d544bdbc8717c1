"""The report's Markdown and JSON on hand-made results (no model): interval columns, the
validation prediction beside the held-out result, dense-kept rows, the speedup plot."""

from __future__ import annotations

import json

import pytest
from report_data import VALIDATED_ENTRY

from tss_opt.evaluation.evaluator import EvalResult, PromptRecord
from tss_opt.report import (
    DomainComparison,
    HeldoutReport,
    assess,
    markdown_report,
    report_to_dict,
    write_report,
)
from tss_opt.report.tables import markdown_table, table_rows, validation_table


def result(skip, accept, scores, tps, repetition=None) -> EvalResult:
    n = len(accept)
    rep = repetition or [0.0] * n
    prompts = [
        PromptRecord(id=f"p{i}", output="x", score=scores[i], accept_length=accept[i], tokens_per_s=tps[i],
                     new_tokens=8, steps=4, index=i, repetition=rep[i])
        for i in range(n)
    ]
    return EvalResult(
        skip=frozenset(skip), accept_length=sum(accept) / n, metric=sum(scores) / n, cost=0.5, cost_analytic=0.5,
        cost_measured=0.0, tokens_per_s=sum(tps) / n, new_tokens=8 * n, steps=4 * n, wall_s=1.0, prompts=prompts,
    )


NATIVE = result([], [2.0, 2.1, 1.9, 2.0], [0.5, 0.4, 0.6, 0.5], [100.0, 110.0, 90.0, 100.0])
TSS = result([2, 3], [2.4, 2.5, 2.3, 2.4], [0.5, 0.41, 0.59, 0.5], [120.0, 130.0, 105.0, 125.0], [0.0, 0.1, 0.0, 0.0])


def comparison(entry, tss=TSS, reason=None) -> DomainComparison:
    comp = DomainComparison(
        domain="qa", metric_name="token_f1", native=NATIVE, tss=tss, num_layers=4, max_new_tokens=8,
        entry=dict(entry), dense_kept_reason=reason,
    )
    return assess(comp, resamples=500, seed=1)


def report_of(*comps) -> HeldoutReport:
    rep = HeldoutReport(model="m", num_layers=4, drafter="pld", scope="verify", temperature=0.0, mapping_path=None,
                        resamples=500, seed=1)
    rep.domains.extend(comps)
    return rep


def test_tss_row_has_paired_intervals():
    comp = comparison(VALIDATED_ENTRY)
    assert comp.stats.accept_diff.estimate == pytest.approx(0.4)
    assert comp.stats.speedup.estimate == pytest.approx(comp.speedup)
    assert comp.stats.repetition_diff.estimate == pytest.approx(0.025)
    native_row, tss_row = table_rows(comp)
    assert "accept_diff" not in native_row
    assert tss_row["accept_diff"]["estimate"] == pytest.approx(0.4) and tss_row["speedup_interval"]["method"] == "paired bootstrap"
    md = markdown_table(report_of(comp))
    assert "| Speedup | ΔA per prompt [CI] | A ratio [CI] | ΔMetric per prompt [CI] | Speedup [CI] |" in md
    tss_line = next(line for line in md.splitlines() if "| TSS |" in line)
    sp = comp.stats.speedup
    assert f"+0.400 [{comp.stats.accept_diff.lower:+.3f}, {comp.stats.accept_diff.upper:+.3f}]" in tss_line
    assert f"{sp.estimate:.2f}× [{sp.lower:.2f}, {sp.upper:.2f}]" in tss_line


def test_validation_columns_with_and_without_validation_data():
    validated = comparison(VALIDATED_ENTRY)
    assert validated.prediction is not None
    assert validated.verdict.accept_ratio_error == pytest.approx(validated.stats.accept_ratio.estimate / 1.2 - 1)
    line = next(x for x in validation_table(report_of(validated)).splitlines() if x.startswith("| qa "))
    assert "+0.400 (lower bound +0.300) (1.200×)" in line and "-0.0100 (lower bound -0.0200)" in line
    assert line.count("n/a") == 0
    plain = comparison({"skip_set": [2, 3]})
    assert plain.prediction is None and plain.verdict.accept_within_prediction is None
    cells = [c.strip() for c in next(x for x in validation_table(report_of(plain)).splitlines() if x.startswith("| qa ")).split("|")]
    assert cells[3] == "n/a" and cells[5] == "n/a" and cells[6] == "n/a"  # validation ΔA, within 10%, validation ΔM
    data = report_to_dict(report_of(validated))["domains"]["qa"]
    assert data["validation_prediction"]["accept_length_ratio"] == pytest.approx(1.2)
    assert data["verdict"]["accept_within_prediction"] is not None
    assert report_to_dict(report_of(plain))["domains"]["qa"]["validation_prediction"] is None


def test_dense_kept_row(tmp_path):
    entry = {"skip_set": [], "validation": {"dense_kept": True, "reason": "dense kept: no candidate passed validation"}}
    comp = comparison(entry, tss=None, reason="no candidate passed validation")
    assert comp.dense_kept and comp.stats is None and comp.speedup == 1.0 and comp.verdict.dense_kept
    rows = table_rows(comp)
    assert len(rows) == 1 and rows[0]["method"] == "Native (dense kept)"
    assert rows[0]["dense_kept_reason"] == "no candidate passed validation"
    rep = report_of(comp)
    md = markdown_report(rep)
    assert "| qa | Native (dense kept) | — | 0/4 (0.0%) |" in md and "| TSS |" not in md
    assert "dense kept: no candidate passed validation" in md
    data = report_to_dict(rep)
    assert data["domains"]["qa"]["tss"] is None and data["domains"]["qa"]["dense_kept"] is True
    paths = write_report(rep, tmp_path)
    assert paths["speedup"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.loads(paths["json"].read_text(encoding="utf-8"))


def test_json_is_standard_and_holds_every_number(tmp_path):
    rep = report_of(comparison(VALIDATED_ENTRY))
    paths = write_report(rep, tmp_path)
    data = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert data["intervals"]["level"] == 0.9 and data["intervals"]["seed"] == 1
    qa = data["domains"]["qa"]
    assert set(qa["stats"]) == {"accept_diff", "accept_ratio", "metric_diff", "speedup", "repetition_diff"}
    assert [p["repetition"] for p in qa["tss"]["prompts"]] == [0.0, 0.1, 0.0, 0.0]
    assert data["plots"]["speedup"] == str(tmp_path / "speedup.png")
    assert "[speedup](speedup.png)" in paths["markdown"].read_text(encoding="utf-8")
