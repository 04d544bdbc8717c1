"""Training text: calibration prompts and disjoint extra records only (never a validation or
held-out prompt), the target's greedy continuations, the cache, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from training_support import EOS, EXTRA, TOY, settings, write_toy_domain

from tss_opt.config import config_dir
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import (
    Domain,
    available_domains,
    format_prompt,
    load_domain,
    read_examples,
)
from tss_opt.models import LoadedModel
from tss_opt.training import TrainingDataError, build_training_text, domain_text
from tss_opt.training import data as data_mod
from tss_opt.training.data import greedy_continuations
from tss_opt.training.features import extract_features

SHIPPED = available_domains([config_dir()])


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def _shipped(name: str) -> Domain:
    return load_domain(OmegaConf.load(config_dir() / "domain" / f"{name}.yaml"))


# ----------------------------------------------------------------------------- shipped text
def test_shipped_training_files_are_package_data() -> None:
    files = sorted(p.name for p in (Path(str(config_dir())).resolve().parent / "tss_opt" / "data" / "train").glob("*.jsonl"))
    assert files == ["chat_prompts.jsonl", "mmlu.jsonl", "qa.jsonl"]
    with_extra = {n for n in SHIPPED if _shipped(n).config.train_data}
    assert with_extra == {"qa", "mmlu"}


@pytest.mark.parametrize("name", ["qa", "mmlu"])
def test_shipped_extra_text_never_equals_a_protected_prompt(name: str) -> None:
    """No extra record is a validation or held-out prompt of ANY shipped domain (the general
    head trains on all of them), nor a pool prompt of its own domain; nor, by question text,
    a pool question (NQ-open question, MMLU question)."""
    domain = _shipped(name)
    extra = read_examples(domain.config.train_data, domain.config)
    assert len(extra) == {"qa": 1000, "mmlu": 300}[name]
    protected = {
        _norm(e.prompt)
        for other in SHIPPED
        for split in ("validation", "heldout")
        for e in _shipped(other).split(split)
    }
    own_pool = {_norm(e.prompt) for e in domain.pool}
    assert len(protected) == len(SHIPPED) * 64
    for e in extra:
        assert _norm(e.prompt) not in protected, e.id
        assert _norm(e.prompt) not in own_pool, e.id
    field = {"qa": "nq_question", "mmlu": "question"}[name]
    pool_questions = {_norm(e.fields[field]) for e in domain.pool}
    assert not [e.id for e in extra if _norm(e.fields[field]) in pool_questions]
    if name == "qa":  # rag prompts quote Natural Questions: none of ours appears in them
        rag = " ".join(_norm(e.prompt) for e in _shipped("rag").pool)
        assert not [e.id for e in extra if _norm(e.fields["nq_question"]) in rag]
    # The test can fail: a pool prompt is caught.
    assert _norm(domain.split("validation")[0].prompt) in protected


def test_domain_text_uses_calibration_and_drops_pool_prompts(toy_domain: Domain, tmp_path: Path) -> None:
    dt = domain_text(toy_domain, ["calibration", "extra"])
    assert [e.id for e in dt.calibration] == [e.id for e in toy_domain.split("calibration")]
    assert [e.prompt for e in dt.extra] == EXTRA and dt.dropped == 0
    held = {e.id for s in ("validation", "heldout") for e in toy_domain.split(s)}
    assert not held & {e.id for e in dt.examples}

    # Extra records equal to a validation / held-out / calibration prompt (up to case and
    # spacing) are dropped; so is nothing else.
    val, heldout, calib = (toy_domain.split(s)[0].prompt for s in ("validation", "heldout", "calibration"))
    leaky = load_domain(write_toy_domain(tmp_path, ["fresh text.", val.upper(), "  " + heldout, calib]))
    dt = domain_text(leaky, ["extra"])
    assert [e.prompt for e in dt.extra] == ["fresh text."] and dt.dropped == 3
    assert domain_text(leaky, ["calibration", "extra"], extra_prompts=0).extra == []


def test_domain_without_training_text(tmp_path: Path) -> None:
    summarization = _shipped("summarization")
    with pytest.raises(
        TrainingDataError,
        match=r"domain 'summarization' has no training text from train.sources=\['extra'\]: train.sources leaves out its calibration prompts; it has no train_data",
    ):
        domain_text(summarization, ["extra"])
    leaky = load_domain(write_toy_domain(tmp_path, [TOY[0]]))
    with pytest.raises(TrainingDataError, match=r"every record of its train_data .* equals a pool prompt"):
        domain_text(leaky, ["extra"])
    with pytest.raises(TrainingDataError, match=r"train.extra_prompts=0"):
        domain_text(leaky, ["extra"], extra_prompts=0)


# ----------------------------------------------------------------------------- sequences
def test_continuations_are_the_plain_targets_greedy_tokens(tiny64: LoadedModel) -> None:
    tok = tiny64.tokenizer
    prompts = [torch.tensor(tok(t).input_ids) for t in TOY[:5]]
    got = greedy_continuations(tiny64.model, prompts, 20, batch_size=3, eos_token_ids=[EOS])
    for p, c in zip(prompts, got):
        want = tiny64.model.generate(p[None], max_new_tokens=20, do_sample=False, eos_token_id=EOS, pad_token_id=EOS, attention_mask=torch.ones_like(p[None]))[0, p.numel():]
        stop = (want == EOS).nonzero()
        want = want[: int(stop[0]) + 1] if len(stop) else want
        assert c.tolist() == want.tolist()
    assert [c.numel() for c in greedy_continuations(tiny64.model, prompts, 0)] == [0] * 5


@pytest.mark.parametrize("batch", [1, 4])
def test_training_text_is_formatted_prompts_plus_continuations(
    batch: int, tiny64: LoadedModel, target64: TargetModel, toy_domain: Domain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dt = domain_text(toy_domain, ["calibration", "extra"])
    s = settings(continuation_tokens=12, generation_batch=batch)
    text = build_training_text(target64, tiny64.tokenizer, [dt], s, [EOS], cache_dir=tmp_path, model_key="m")
    assert len(text.sequences) == 6 + 6
    engine = SpeculativeEngine(target64, None, eos_token_ids=[EOS])
    for ex, seq, n in zip(dt.examples, text.sequences, text.prompt_lengths):
        ids = format_prompt(tiny64.tokenizer, ex)
        assert seq[:n].tolist() == ids.tolist()
        # The continuation is the target's greedy one; the engine path keeps all but the
        # newest token (it has no feature yet).
        want = engine.generate(ids, max_new_tokens=12).tokens.tolist()
        assert seq[n:].tolist() == (want if batch > 1 else want[:-1])
    generated = sum(int(q.numel()) - n for q, n in zip(text.sequences, text.prompt_lengths))
    assert text.counts["toy"] == {"calibration": 6, "extra": 6, "dropped": 0, "too_long": 0, "generated": generated}
    assert text.features.num_pairs == text.num_pairs == text.num_tokens - len(text.sequences)
    assert "6 calibration + 6 extra prompts" in text.describe()
    # Features and labels equal a fresh forward of the dense target over the whole sequences.
    fresh = extract_features(target64, text.sequences)
    torch.testing.assert_close(text.features.features, fresh.features, rtol=1e-6, atol=1e-6)
    assert torch.equal(text.features.labels, fresh.labels) and torch.equal(text.features.tokens, fresh.tokens)

    # A second build reads the cache and generates nothing; other settings miss it.
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("generated again")

    monkeypatch.setattr(data_mod, "greedy_continuations", boom)
    monkeypatch.setattr(data_mod, "greedy_features", boom)
    again = build_training_text(target64, tiny64.tokenizer, [dt], s, [EOS], cache_dir=tmp_path, model_key="m")
    assert [q.tolist() for q in again.sequences] == [q.tolist() for q in text.sequences]
    assert torch.equal(again.features.features, text.features.features)
    with pytest.raises(AssertionError, match="generated again"):
        build_training_text(target64, tiny64.tokenizer, [dt], settings(continuation_tokens=13, generation_batch=batch), [EOS], cache_dir=tmp_path, model_key="m")
    with pytest.raises(AssertionError, match="generated again"):
        build_training_text(target64, tiny64.tokenizer, [dt], s, [EOS], cache_dir=tmp_path, model_key="other model")
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".pt"]


def test_prompt_only_text(tiny64: LoadedModel, target64: TargetModel, toy_domain: Domain) -> None:
    dt = domain_text(toy_domain, ["calibration"])
    text = build_training_text(target64, tiny64.tokenizer, [dt], settings(continuation_tokens=0), [EOS])
    assert text.sequences[0].tolist() == format_prompt(tiny64.tokenizer, dt.calibration[0]).tolist()
    fresh = extract_features(target64, text.sequences)
    torch.testing.assert_close(text.features.features, fresh.features, rtol=1e-6, atol=1e-6)
    assert torch.equal(text.features.labels, fresh.labels)


def test_prompts_too_long_for_the_model_are_left_out(tiny64: LoadedModel, toy_domain: Domain) -> None:
    dt = domain_text(toy_domain, ["calibration", "extra"])
    lengths = sorted(int(format_prompt(tiny64.tokenizer, e).numel()) for e in dt.examples)
    assert lengths[0] < lengths[-1]
    short = TargetModel(tiny64.model, max_context=lengths[0] + 8)  # prompt + 8 + 1 > context
    with pytest.raises(TrainingDataError, match=rf"no training sequence fits the model's {lengths[0] + 8} positions"):
        build_training_text(short, tiny64.tokenizer, [dt], settings(continuation_tokens=8), [EOS])
    fits = TargetModel(tiny64.model, max_context=lengths[0] + 9)
    text = build_training_text(fits, tiny64.tokenizer, [dt], settings(continuation_tokens=8), [EOS])
    n_short = lengths.count(lengths[0])
    assert len(text.sequences) == n_short and text.counts["toy"]["too_long"] == 12 - n_short


def test_training_text_json_records_are_unchanged(tmp_path: Path) -> None:
    # read_examples keeps every field (ids, references when present) and needs no references.
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "p", "extra": 1}) + "\n")
    (ex,) = read_examples(str(path), {"name": "x", "data": str(path)})
    assert (ex.id, ex.prompt, ex.references, ex.fields["extra"]) == ("a", "p", (), 1)
