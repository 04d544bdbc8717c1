"""The held-out report on the tiny model: interleaving, aggregation, Markdown, JSON, plots."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import matplotlib.image
import pytest
from report_data import VALIDATED_ENTRY

from tss_opt.decoding import engine as engine_mod
from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.metrics.repetition import repeated_ngram_share
from tss_opt.mapping import MappingError, export_mapping, load_mapping
from tss_opt.report import (
    ReportError,
    add_study_plots,
    compare_domain,
    run_heldout,
    write_report,
)
from tss_opt.report.heldout import study_storage
from tss_opt.search import run_search

TINY_ID = "tiny-llama-4l-seed0"
N_NEW = 8
METRICS = {"qa": "token_f1", "translation": "bleu"}


def pld() -> PromptLookupDrafter:
    return PromptLookupDrafter(num_tokens=4, max_ngram=2, min_ngram=1)


class SyntheticEvaluator:
    """A made-up A, M, C landscape over 4 layers: layer 0 hurts, layers 2 and 3 help."""

    num_layers = 4

    def __init__(self, metric_name: str) -> None:
        self.metric_name = metric_name

    def __call__(self, skip: frozenset[int]) -> dict[str, float]:
        a = 2.0 + 0.15 * len(skip) - (0.6 if 0 in skip else 0.0) + (0.1 if 2 in skip else 0.0)
        m = 0.5 - 0.05 * len(skip) - (0.3 if 0 in skip else 0.0) + (0.04 if 3 in skip else 0.0)
        return {"accept_length": a, "metric": m, "cost": (4 - len(skip)) / 4 / a}


def make_domain(tmp_path: Path, name: str, n: int = 6):
    lines = [
        json.dumps({"id": f"{name}{i}", "prompt": f"{name} prompt {i}: the cat sat on the mat {i}", "references": [f"the cat {i}"]})
        for i in range(n)
    ]
    data = tmp_path / f"{name}.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_domain(
        {"name": name, "data": str(data), "metric": METRICS[name], "pool_size": n, "calibration_size": 2, "validation_size": 0,
         "heldout_size": n - 2, "max_new_tokens": N_NEW}
    )


@pytest.fixture(scope="module")
def studied(tmp_path_factory):
    """A temp SQLite storage with one finished search per domain, exported into a mapping."""
    tmp = tmp_path_factory.mktemp("report")
    url = f"sqlite:///{tmp / 'tss.db'}"
    mapping_path = tmp / "mapping.yaml"
    for domain, metric in METRICS.items():
        name = f"{domain}.tiny"
        run_search(
            SyntheticEvaluator(metric), storage=url, study_name=name, max_depth=3, eps_metric=0.2, tau_metric=0.2,
            metadata={"model": TINY_ID, "domain": domain, "drafter": "pld"}, show_progress=False,
        )
        export_mapping(url, name, mapping_path)
    mapping = load_mapping(mapping_path)
    # qa carries validation figures (as export writes them after validation); translation none.
    mapping = mapping.with_entry(replace(mapping.entry_for("qa"), validation=VALIDATED_ENTRY["validation"]))
    return tmp, url, mapping


@pytest.fixture(scope="module")
def target(tiny):
    return TargetModel(tiny.model)


@pytest.fixture(scope="module")
def report(tiny, target, studied, tmp_path_factory):
    tmp, url, mapping = studied
    domains = [make_domain(tmp, d) for d in METRICS]
    rep = run_heldout(
        target, tiny.tokenizer, pld, mapping, domains, model_id=TINY_ID, drafter="pld", prompts=3, show_progress=True
    )
    out = tmp / "out"
    for comp in rep.domains:
        add_study_plots(comp, out)
    return rep, write_report(rep, out), out


def test_mapping_has_the_searched_skip_sets(studied):
    _, _, mapping = studied
    assert mapping.domains == ["qa", "translation"]
    assert mapping.entry_for("qa").skip_set == (2, 3)


def test_report_writes_table_json_and_plots(report, studied):
    rep, paths, out = report
    _, _, mapping = studied
    md = paths["markdown"].read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| qa ") or line.startswith("| translation ")]
    assert [r.split("|")[1:4] for r in rows][:4] == [
        [" qa ", " Native ", " — "],
        [" qa ", " TSS ", " {2, 3} "],
        [" translation ", " Native ", " — "],
        [" translation ", " TSS ", " {2, 3} "],
    ]
    assert "| Domain | Method | Skip set | Sparsity | Accepted length | Metric | tok/s | Speedup |" in md
    assert "Mean over 2 domain(s): speedup" in md
    assert "2/4 (50.0%)" in md and "(token_f1)" in md and "(bleu)" in md and "1.00×" in md
    data = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert [(r["domain"], r["method"], r["skip_set"]) for r in data["rows"]] == [
        ("qa", "Native", []), ("qa", "TSS", [2, 3]), ("translation", "Native", []), ("translation", "TSS", [2, 3]),
    ]
    assert data["model"] == TINY_ID and set(data["domains"]) == {"qa", "translation"}
    qa = data["domains"]["qa"]
    assert len(qa["native"]["prompts"]) == len(qa["tss"]["prompts"]) == 3
    assert qa["mapping_entry"]["skip_set"] == list(mapping.entry_for("qa").skip_set)
    for domain in METRICS:
        for kind in ("profile", "pareto"):
            png = out / f"{kind}_{domain}.png"
            assert data["domains"][domain]["plots"][kind] == str(png)
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            h, w, _ = matplotlib.image.imread(png).shape
            assert h > 300 and w > 500
            assert f"[{kind}]({png.name})" in md  # relative links


def test_aggregates_follow_the_conventions(report):
    rep, _, _ = report
    for comp in rep.domains:
        for res in (comp.native, comp.tss):
            tps = [p.tokens_per_s for p in res.prompts]
            assert res.tokens_per_s == pytest.approx(sum(tps) / len(tps))  # mean over prompts
            assert res.accept_length == pytest.approx(
                sum(p.accept_length * p.steps for p in res.prompts) / sum(p.steps for p in res.prompts)
            )
            assert all(1 <= p.new_tokens <= N_NEW for p in res.prompts)
        assert comp.speedup == pytest.approx(comp.tss.tokens_per_s / comp.native.tokens_per_s)  # ratio of means
        assert comp.native.skip == frozenset() and comp.tss.skip == frozenset({2, 3})


def test_runs_interleave_dense_and_tss_per_prompt(tiny, target, tmp_path, monkeypatch):
    calls: list[tuple[frozenset[int], int]] = []
    original = engine_mod.SpeculativeEngine.generate

    def spy(self, prompt_ids, **kwargs):
        calls.append((frozenset(kwargs["skip"]), kwargs["max_new_tokens"]))
        return original(self, prompt_ids, **kwargs)

    monkeypatch.setattr(engine_mod.SpeculativeEngine, "generate", spy)
    domain = make_domain(tmp_path, "qa")
    native, tss = compare_domain(target, tiny.tokenizer, pld, domain, [1], prompts=3, show_progress=False)
    timed = [s for s, n in calls if n == N_NEW]
    assert timed == [frozenset(), frozenset({1})] * 3
    assert [s for s, n in calls if n != N_NEW] == [frozenset(), frozenset({1})]  # untimed warm-up
    assert [p.id for p in native.prompts] == [p.id for p in tss.prompts] == [ex.id for ex in domain.split("heldout")[:3]]


def test_outputs_equal_the_engine_per_skip_set(tiny, target, tmp_path):
    from tss_opt.decoding.engine import SpeculativeEngine
    from tss_opt.evaluation.domains import format_prompt

    domain = make_domain(tmp_path, "qa")
    native, tss = compare_domain(target, tiny.tokenizer, pld, domain, [2, 3], prompts=2, show_progress=False)
    for res, skip in ((native, []), (tss, [2, 3])):
        eng = SpeculativeEngine(target, pld())
        for i, ex in enumerate(domain.split("heldout")[:2]):
            toks = eng.generate(format_prompt(tiny.tokenizer, ex), max_new_tokens=N_NEW, skip=skip, seed=i).tokens
            assert res.prompts[i].output == tiny.tokenizer.decode(toks, skip_special_tokens=True)


def test_too_many_prompts_and_unmapped_domains_are_refused(tiny, target, tmp_path, studied):
    domain = make_domain(tmp_path, "qa")
    with pytest.raises(ReportError, match="heldout_prompts=9 .* has 4 prompts"):
        compare_domain(target, tiny.tokenizer, pld, domain, [1], prompts=9)
    _, _, mapping = studied
    other = load_domain({"name": "rag", "data": str(tmp_path / "qa.jsonl"), "metric": "token_f1", "pool_size": 6,
                         "calibration_size": 2, "validation_size": 0, "heldout_size": 4})
    with pytest.raises(ReportError, match="no mapping entry for domain.*rag.*mapped: qa, translation"):
        run_heldout(target, tiny.tokenizer, pld, mapping, [other], model_id=TINY_ID)
    with pytest.raises(MappingError, match="another-model"):
        run_heldout(target, tiny.tokenizer, pld, mapping, [domain], model_id="another-model")


def test_study_storage_resolution(tmp_path):
    db = tmp_path / "s.db"
    with pytest.raises(ReportError, match="hides its password.*storage="):
        study_storage({"name": "x", "storage": "postgresql+psycopg://u:***@127.0.0.1/test"})
    with pytest.raises(ReportError, match=f"SQLite file {db} .* not found"):
        study_storage({"name": "x", "storage": f"sqlite:///{db}"})
    assert not db.exists()  # never created as a side effect
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    assert study_storage({"name": "x", "storage": "postgresql+psycopg://u:***@h/db"}, url) == url
    with pytest.raises(ReportError, match="names no storage"):
        study_storage({"name": "x"})


def test_missing_study_leaves_a_reason_not_a_crash(report, tmp_path):
    rep, _, _ = report
    comp = rep.domains[0]
    saved = dict(comp.entry)
    try:
        comp.entry = {**saved, "study": {"name": "no-such-study", "storage": saved["study"]["storage"]}}
        comp.plots, comp.plot_error = {}, None
        add_study_plots(comp, tmp_path)
        assert comp.plots == {} and "no-such-study" in (comp.plot_error or "")
    finally:
        comp.entry = saved


def test_per_prompt_records_keep_tokens_and_repetition(report):
    rep, _, _ = report
    for comp in rep.domains:
        for res in (comp.native, comp.tss):
            for p in res.prompts:
                assert len(p.token_ids) == p.new_tokens >= 1
                assert p.repetition == repeated_ngram_share(p.token_ids)
        assert [p.index for p in comp.native.prompts] == [0, 1, 2]


def test_intervals_prediction_and_verdict_on_the_tiny_model(report):
    rep, paths, _ = report
    qa, tr = rep.domains
    for comp in (qa, tr):
        st = comp.stats
        assert st.speedup.estimate == pytest.approx(comp.speedup)
        assert st.accept_diff.n == 3 and st.accept_diff.lower <= st.accept_diff.estimate <= st.accept_diff.upper
        assert st.speedup.lower <= st.speedup.upper and st.speedup.seed == rep.seed
        assert st.metric_diff.estimate == pytest.approx(
            sum(t.score - n.score for t, n in zip(comp.tss.prompts, comp.native.prompts, strict=True)) / 3
        )
        assert comp.verdict is not None and not comp.verdict.dense_kept
    assert qa.prediction is not None and qa.prediction.accept_ratio == pytest.approx(1.2)
    assert qa.verdict.accept_within_prediction is not None
    assert tr.prediction is None and tr.verdict.accept_within_prediction is None
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "## Validation prediction against held-out, and the verdict" in md
    qa_line = next(x for x in md.splitlines() if x.startswith("| qa | {2, 3} | +0.400 (lower bound +0.300)"))
    assert "goal" in qa_line
    tr_line = next(x for x in md.splitlines() if x.startswith("| translation | {2, 3} | n/a |"))
    assert tr_line.count("n/a") >= 3
    data = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert data["domains"]["qa"]["validation_prediction"]["num_prompts"] == 16
    assert data["domains"]["translation"]["validation_prediction"] is None
    assert data["rows"][1]["speedup_interval"]["level"] == 0.9
    assert paths["speedup"].is_file()


def test_dense_kept_domain_runs_native_once(tiny, target, studied, tmp_path, monkeypatch):
    _, _, mapping = studied
    entry = mapping.entry_for("qa")
    kept = replace(
        entry, skip_set=(), validation={**VALIDATED_ENTRY["validation"], "chosen": [], "dense_kept": True,
                                        "figures": None, "reason": "dense kept: no candidate passed validation"},
    )
    dense_mapping = mapping.with_entry(kept)
    calls: list[frozenset[int]] = []
    original = engine_mod.SpeculativeEngine.generate

    def spy(self, prompt_ids, **kwargs):
        calls.append(frozenset(kwargs["skip"]))
        return original(self, prompt_ids, **kwargs)

    monkeypatch.setattr(engine_mod.SpeculativeEngine, "generate", spy)
    rep = run_heldout(
        target, tiny.tokenizer, pld, dense_mapping, [make_domain(tmp_path, "qa")], model_id=TINY_ID, prompts=2,
        show_progress=False,
    )
    assert calls == [frozenset()] * 3  # one warm-up, then each prompt once: dense is not compared with itself
    (comp,) = rep.domains
    assert comp.dense_kept and comp.tss is None and comp.num_prompts == 2
    assert comp.dense_kept_reason == "no candidate passed validation"
    assert comp.verdict.dense_kept and comp.verdict.goal_met and comp.speedup == 1.0
    paths = write_report(rep, tmp_path / "out")
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "| qa | Native (dense kept) | — |" in md and "| qa | TSS |" not in md
    assert "dense kept: no candidate passed validation" in md
    data = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert [r["method"] for r in data["rows"]] == ["Native (dense kept)"] and data["domains"]["qa"]["tss"] is None
