"""The vLLM plugin on the embedded SmolLM2-135M (30 layers, float32, greedy): the mapped skip
set of the committed CPU preset ({3, 14}) against vLLM serving the exported checkpoint and
against our own engine's plain greedy decoding of the same sparse target, both scopes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_support import compare, run_job

from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.mapping.checkpoint import delete_layers, save_checkpoint
from tss_opt.models import ModelConfig, load_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
MAPPING = REPO / "docs" / "results" / "mapping_cpu_preset.yaml"  # mmlu -> {3, 14}, scope verify
SKIP = (3, 14)
NEW = 32
ENGINE = {"dtype": "float32", "max_model_len": 2048, "seed": 0, "max_num_seqs": 8, "disable_log_stats": False}
GREEDY = {"temperature": 0.0, "max_tokens": NEW, "ignore_eos": True, "logprobs": 2}


@pytest.fixture(scope="module")
def runs(embedded, summarization_prompts, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("vllm_embedded")
    model_dir = REPO / "storage" / "models" / embedded.config.name  # the conversion the fixture made
    prompts = [p.tolist() for p in summarization_prompts]
    batches = [{"name": "dense", "prompts": prompts, "params": {**GREEDY}}]
    for scope in ("all", "verify"):
        batches.append({"name": scope, "prompts": prompts,
                        "params": {**GREEDY, "extra_args": {"tss_skip": list(SKIP), "tss_scope": scope}}})
    batches.append({"name": "domain:mmlu", "prompts": prompts, "params": {**GREEDY, "extra_args": {"tss_domain": "mmlu"}}})
    out = {"tss": run_job({
        "model": str(model_dir), "engine": ENGINE, "tss": True, "mapping": str(MAPPING),
        "model_id": embedded.model_id, "batches": batches, "counts": True,
    }, tmp, "tss")}
    export = tmp / "export"
    sparse = load_model(ModelConfig(cache_dir=str(REPO / "storage" / "models")))
    delete_layers(sparse.model, SKIP)
    save_checkpoint(sparse.model, sparse.tokenizer, export)
    out["export"] = run_job({"model": str(export), "engine": ENGINE, "batches": batches[:1]}, tmp, "export")
    return out


def _rows(run: dict, batch: str) -> list[dict]:
    assert not run.get("failed"), run.get("output")
    return run["batches"][batch]


def test_scope_all_is_vllm_serving_the_exported_checkpoint(runs):
    ours, export = _rows(runs["tss"], "all"), _rows(runs["export"], "dense")
    assert [r["tokens"] for r in ours] == [r["tokens"] for r in export]
    gap = max(abs(pa[t] - pb[t]) for ra, rb in zip(ours, export) for pa, pb in zip(ra["logprobs"], rb["logprobs"]) for t in pa if t in pb)
    print(f"scope all {SKIP} vs the exported checkpoint: largest log-probability difference {gap:.2e}")
    assert gap <= 1e-4


def test_the_domain_runs_its_mapped_set_with_its_scope(runs):
    assert [r["tokens"] for r in _rows(runs["tss"], "domain:mmlu")] == [r["tokens"] for r in _rows(runs["tss"], "verify")]


@pytest.mark.parametrize("scope", ["all", "verify"])
def test_our_engine_on_the_same_sparse_target(runs, embedded, summarization_prompts, scope):
    """Equal tokens, or a first difference at a near-tie (vLLM's top two log-probabilities
    there within NEAR_TIE, ours its second choice): counted and printed."""
    engine = SpeculativeEngine(TargetModel(embedded.model))
    near = []
    for prompt, row in zip(summarization_prompts, _rows(runs["tss"], scope)):
        ref = engine.generate(prompt, max_new_tokens=NEW, skip=SKIP, scope=scope).tokens.tolist()
        c = compare(row["tokens"], ref, row["logprobs"])
        assert c.equal or c.near_tie, f"first difference at {c.index} (top-2 gap {c.gap}): {row['tokens']} vs {ref}"
        if c.near_tie:
            near.append((c.index, c.gap))
    print(f"scope {scope}: {len(summarization_prompts) - len(near)} equal, near-ties {near}")
    assert len(_rows(runs["tss"], scope)) == len(summarization_prompts)


def test_the_skipped_layers_are_counted(runs):
    counts = runs["tss"]["counts"]
    assert counts["skipped"][3] > 0 and counts["skipped"][14] > 0 and counts["skipped"][4] == 0
    torch.testing.assert_close(torch.tensor(counts["tokens_skipped"][3]), torch.tensor(counts["tokens_skipped"][14]))
