"""TSS inside vLLM, with real vLLM on the tiny model (greedy, float32): each request on its
own skip set, exactly what plain vLLM, an exported checkpoint or our own engine emits.

Each engine runs in a process of its own (vllm_job.py, vLLM's offline API); the module's
fixture runs them once, in order, and the tests read what they emitted.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import yaml
from runtime_support import mapping_data
from vllm_support import TINY_VLLM, TINY_VLLM_ID, compare, run_job

from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.mapping.checkpoint import delete_layers, save_checkpoint
from tss_opt.models import as_model_config, load_model
from tss_opt.models.local_dir import checkpoint_dir

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(3600)]

NEW = 16
SETS = [(1,), (0,), (3,), (1, 2)]  # layer 0 (no residual yet) and the last layer included
EXPORTED = [(0,), (1, 2)]
ENGINE = {"dtype": "float32", "max_model_len": 1024, "block_size": 32, "seed": 0, "max_num_seqs": 8, "disable_log_stats": False}
# Log-probabilities of two engines (other model classes, other processes) may differ in their
# last bits; measured here at most 3e-6 between the TSS model and vLLM's own Llama, tokens equal.
LOGPROB_TOL = 1e-5
GREEDY = {"temperature": 0.0, "max_tokens": NEW, "ignore_eos": True, "logprobs": 2}


def _prompts() -> tuple[list[list[int]], list[int]]:
    rng = random.Random(0)
    short = []
    for n in (6, 9, 13, 20):  # a repeated motif: vLLM's ngram drafts find matches
        motif = [rng.randrange(256) for _ in range(4)]
        short.append([257] + (motif * n)[:n])
    long = [257] + [rng.randrange(256) for _ in range(150)]  # 4 full blocks of 32 and a part
    return short, long


SHORT, LONG = _prompts()


def _xargs(skip: tuple[int, ...] | None, scope: str) -> dict | None:
    return None if skip is None else {"tss_skip": list(skip), "tss_scope": scope}


def _p(skip: tuple[int, ...] | None = None, scope: str = "all", **kw) -> dict:
    return {**GREEDY, "extra_args": _xargs(skip, scope), **kw}


def _solo_batches() -> list[dict]:
    out = [{"name": "dense", "prompts": SHORT, "params": _p()}]
    for s in SETS:
        for scope in ("all", "verify"):
            out.append({"name": f"{scope}:{s}", "prompts": SHORT, "params": _p(s, scope)})
    # One batch, four rows of the same prompt: dense, two sets, and one overlapping both.
    rows = [(None, "all"), ((1,), "all"), ((1, 2), "verify"), ((2,), "all"), ((1, 2), "all")]
    out.append({"name": "mixed", "prompts": [SHORT[3]] * len(rows), "params": [_p(s, sc) for s, sc in rows]})
    return out


def _cache_batches() -> list[dict]:
    """The same long prompt under three skip sets, one after the other (each later request finds
    the earlier one's blocks in the prefix cache unless their salts differ), then a second turn
    of a verify-scope conversation (its prompt holds the first answer's tokens)."""
    long = {**GREEDY, "max_tokens": 48}
    return [
        {"name": "cache:dense", "prompts": [LONG], "params": {**long, "extra_args": None}},
        {"name": "cache:dense-again", "prompts": [LONG], "params": {**long, "extra_args": None}},
        {"name": "cache:all1", "prompts": [LONG], "params": {**long, "extra_args": _xargs((1,), "all")}},
        {"name": "cache:verify1", "prompts": [LONG], "params": {**long, "extra_args": _xargs((1,), "verify")}},
        {"name": "cache:turn2", "prompts": [{"after": ["cache:verify1", 0], "then": [257, 40, 41, 42]}],
         "params": {**long, "extra_args": _xargs((1,), "verify")}},
    ]


def _crowd() -> dict:
    """Three short prompts with long answers: admitted together, they outgrow a small KV cache
    and vLLM preempts (and later recomputes) one of them."""
    xs = (None, _xargs((1,), "all"), _xargs((1,), "verify"))
    return {"name": "crowd", "prompts": SHORT[:3], "params": [{**GREEDY, "max_tokens": 180, "extra_args": e} for e in xs]}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return Path(checkpoint_dir({**TINY_VLLM, "cache_dir": str(tmp_path_factory.mktemp("models"))}))


def _load_tiny():
    """The same random model in transformers (same seed, same weights)."""
    return load_model(as_model_config(TINY_VLLM))


@pytest.fixture(scope="module")
def runs(tiny_dir: Path, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("vllm_runs")
    mapping = tmp / "mapping.yaml"
    mapping.write_text(yaml.safe_dump(mapping_data({"qa": [1], "summarization": [1, 2]}, scopes={"qa": "all"})))
    bad = [
        {"name": "bad:range", "prompts": SHORT[:1], "params": {**GREEDY, "extra_args": {"tss_skip": [9]}}},
        {"name": "bad:type", "prompts": SHORT[:1], "params": {**GREEDY, "extra_args": {"tss_skip": "1"}}},
        {"name": "bad:scope", "prompts": SHORT[:1], "params": {**GREEDY, "extra_args": {"tss_scope": "most"}}},
        {"name": "bad:key", "prompts": SHORT[:1], "params": {**GREEDY, "extra_args": {"tss_skp": [1]}}},
        {"name": "after-bad", "prompts": SHORT, "params": _p()},
    ]
    domains = [
        {"name": "domain:qa", "prompts": SHORT, "params": {**GREEDY, "extra_args": {"tss_domain": "qa"}}},
        {"name": "domain:summarization", "prompts": SHORT, "params": {**GREEDY, "extra_args": {"tss_domain": "summarization"}}},
        {"name": "domain:unknown", "prompts": SHORT, "params": {**GREEDY, "extra_args": {"tss_domain": "poetry"}}},
    ]
    model = str(tiny_dir)
    out: dict = {}
    out["tss"] = run_job({
        "model": model, "engine": ENGINE, "tss": True, "mapping": str(mapping),
        "model_id": TINY_VLLM_ID, "batches": _solo_batches() + _cache_batches() + [_crowd()] + domains + bad,
        "counts": True, "metrics": True,
    }, tmp, "tss")
    out["plain"] = run_job({"model": model, "engine": ENGINE, "batches": [
        {"name": "dense", "prompts": SHORT, "params": _p()},
        {"name": "tss-field", "prompts": SHORT[:1], "params": _p((1,))},
    ]}, tmp, "plain")
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    out["spec"] = run_job({
        "model": model, "engine": {**ENGINE, "speculative_config": spec}, "tss": True,
        "batches": [{**b, "params": _strip_logprobs(b["params"])} for b in _solo_batches()], "metrics": True,
    }, tmp, "spec")
    # No prefix cache, a tiny token budget per step (chunked prefill) and few KV blocks
    # (preemption, then recomputation): the same tokens.
    out["small"] = run_job({
        "model": model, "tss": True,
        "engine": {**ENGINE, "enable_prefix_caching": False, "max_num_batched_tokens": 32,
                   "num_gpu_blocks_override": 10, "max_model_len": 256},
        "batches": _cache_batches() + [_crowd()],
        "metrics": True,
    }, tmp, "small")
    for s in EXPORTED:
        d = tmp / f"export-{'-'.join(map(str, s))}"
        loaded = _load_tiny()
        delete_layers(loaded.model, s)
        save_checkpoint(loaded.model, loaded.tokenizer, d)
        out[f"export{s}"] = run_job({"model": str(d), "engine": ENGINE, "batches": [
            {"name": "dense", "prompts": SHORT, "params": _p()},
        ]}, tmp, f"export-{len(out)}")
    out["compiled"] = run_job({
        "model": model, "tss": True, "engine": {**ENGINE, "enforce_eager": False}, "batches": [],
    }, tmp, "compiled", timeout=600)
    return out


def _strip_logprobs(params):
    if isinstance(params, dict):
        return {k: v for k, v in params.items() if k != "logprobs"}
    return [_strip_logprobs(p) for p in params]


def _tokens(run: dict, batch: str) -> list[list[int]]:
    assert not run.get("failed"), run.get("output")
    assert batch in run["batches"], f"{batch}: {run['errors'].get(batch)}"
    return [r["tokens"] for r in run["batches"][batch]]


def test_engines_started(runs):
    for name, run in runs.items():
        if name != "compiled":
            assert not run.get("failed"), f"{name}: {run.get('output')}"


def _logprob_gap(a: list[dict], b: list[dict]) -> float:
    """The largest difference between two engines' top log-probabilities (same tokens)."""
    gap = 0.0
    for ra, rb in zip(a, b):
        for pa, pb in zip(ra["logprobs"], rb["logprobs"]):
            assert pa.keys() == pb.keys()
            gap = max(gap, *(abs(pa[t] - pb[t]) for t in pa))
    return gap


def test_a_request_without_tss_fields_is_plain_vllm(runs):
    assert _tokens(runs["tss"], "dense") == _tokens(runs["plain"], "dense")
    gap = _logprob_gap(runs["tss"]["batches"]["dense"], runs["plain"]["batches"]["dense"])
    print(f"dense vs plain vLLM: largest log-probability difference {gap:.2e}")
    assert gap <= LOGPROB_TOL


@pytest.mark.parametrize("skip", EXPORTED, ids=str)
def test_scope_all_is_vllm_serving_the_exported_checkpoint(runs, skip):
    ours = runs["tss"]["batches"][f"all:{skip}"]
    export = runs[f"export{skip}"]["batches"]["dense"]
    assert [r["tokens"] for r in ours] == [r["tokens"] for r in export]
    gap = _logprob_gap(ours, export)
    print(f"scope all {skip} vs the exported checkpoint: largest log-probability difference {gap:.2e}")
    assert gap <= LOGPROB_TOL


def test_skip_sets_change_the_output(runs):
    # The assertions above could not pass by skipping nothing: every set changes some row.
    dense = _tokens(runs["tss"], "dense")
    for s in SETS:
        assert _tokens(runs["tss"], f"all:{s}") != dense, s


@pytest.mark.parametrize("scope", ["all", "verify"])
def test_equal_to_our_engine_on_the_sparse_target(runs, scope):
    """Our engine's plain greedy decoding of the same sparse target: equal, or a first
    difference at a near-tie (counted; the tiny model has none)."""
    target = TargetModel(_load_tiny().model)
    engine = SpeculativeEngine(target)
    near_ties, rows = 0, 0
    for s in SETS:
        for prompt, row in zip(SHORT, runs["tss"]["batches"][f"{scope}:{s}"]):
            ref = engine.generate(torch.tensor(prompt), max_new_tokens=NEW, skip=s, scope=scope).tokens.tolist()
            c = compare(row["tokens"], ref, row["logprobs"])
            assert c.equal or c.near_tie, f"{scope} {s}: first difference at {c.index} (top-2 gap {c.gap}): {row['tokens']} vs {ref}"
            near_ties += c.near_tie
            rows += 1
    assert rows == len(SETS) * len(SHORT) and near_ties == 0


def test_a_mixed_batch_gives_each_row_its_solo_output(runs):
    mixed = _tokens(runs["tss"], "mixed")
    solo = {
        (None, "all"): "dense", ((1,), "all"): "all:(1,)", ((1, 2), "verify"): "verify:(1, 2)",
        ((1, 2), "all"): "all:(1, 2)",
    }
    assert mixed[0] == _tokens(runs["tss"], solo[(None, "all")])[3]
    assert mixed[1] == _tokens(runs["tss"], solo[((1,), "all")])[3]
    assert mixed[2] == _tokens(runs["tss"], solo[((1, 2), "verify")])[3]
    assert mixed[4] == _tokens(runs["tss"], solo[((1, 2), "all")])[3]
    assert len({tuple(r) for r in mixed}) >= 4  # the rows really differ


def test_ngram_speculation_on_and_off_give_the_same_tokens(runs):
    for batch in runs["tss"]["batches"]:
        if batch in runs["spec"]["batches"]:
            assert _tokens(runs["spec"], batch) == _tokens(runs["tss"], batch), batch
    drafts = runs["spec"]["metrics"].get("vllm:spec_decode_num_accepted_tokens", 0)
    assert drafts > 0, "ngram speculation accepted no draft: the comparison checked nothing"


def test_prefix_caching_keeps_each_skip_set_apart(runs):
    """The same prompt under dense, {1} (all) and {1} (verify) after one another, and a second
    turn whose prompt holds a verify-scope answer: with the prefix cache on, each equals the
    engine without a prefix cache (which computes every prompt afresh)."""
    for batch in ("cache:dense", "cache:all1", "cache:verify1", "cache:turn2"):
        assert runs["tss"]["prompts"][batch] == runs["small"]["prompts"][batch]
        assert _tokens(runs["tss"], batch) == _tokens(runs["small"], batch), batch
    assert len({tuple(_tokens(runs["tss"], b)[0]) for b in ("cache:dense", "cache:all1", "cache:verify1")}) == 3
    # The cache was really used: the repeated dense prompt hit it.
    assert runs["tss"]["metrics"].get("vllm:prefix_cache_hits", 0) > 0


def test_chunked_prefill_and_preemption_give_the_same_tokens(runs):
    assert _tokens(runs["small"], "crowd") == _tokens(runs["tss"], "crowd")
    assert len({tuple(r) for r in _tokens(runs["tss"], "crowd")}) == 3
    assert runs["small"]["metrics"].get("vllm:num_preemptions", 0) > 0, "no request was preempted"
    assert runs["tss"]["metrics"].get("vllm:num_preemptions", 0) == 0


def test_domains_resolve_through_the_mapping(runs):
    assert _tokens(runs["tss"], "domain:qa") == _tokens(runs["tss"], "all:(1,)")  # qa: {1}, scope all
    assert _tokens(runs["tss"], "domain:summarization") == _tokens(runs["tss"], "verify:(1, 2)")  # default scope
    assert _tokens(runs["tss"], "domain:unknown") == _tokens(runs["tss"], "dense")


def test_bad_fields_are_refused_at_admission_and_the_engine_goes_on(runs):
    errors = runs["tss"]["errors"]
    assert "out of range" in errors["bad:range"] and "tss_skip" in errors["bad:range"]
    assert "list of layer indices" in errors["bad:type"]
    assert "tss_scope must be one of verify, all" in errors["bad:scope"]
    assert "unknown TSS field" in errors["bad:key"] and "tss_skp" in errors["bad:key"]
    assert _tokens(runs["tss"], "after-bad") == _tokens(runs["tss"], "dense")


def test_plain_vllm_refuses_tss_fields_instead_of_running_dense(runs):
    assert "hf_overrides" in runs["plain"]["errors"]["tss-field"]


def test_layer_counts_show_the_skipped_layers(runs):
    counts = runs["tss"]["counts"]
    assert counts["steps"] > 0 and len(counts["skipped"]) == 4
    # Layer 1 is in most sets: skipped whole steps and run mixed in the mixed batch.
    assert counts["skipped"][1] > 0 and counts["mixed"][1] > 0 and counts["tokens_skipped"][1] > 0


def test_the_compiled_engine_refuses_the_tss_model(runs):
    run = runs["compiled"]
    assert run.get("failed") and "needs vLLM's compilation off" in run["output"], run.get("output", "")[-3000:]
