"""Data-free distillation text: the target samples its own training text from the
training prompts and the shipped chat prompts, deterministically with a seed, never from a
validation or held-out prompt; a head trained on it with a draft vocabulary decodes exactly
greedy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from reference import greedy_dense_prefill
from training_support import EOS, settings

from tss_opt.config.search_path import config_dir
from tss_opt.decoding.drafters.eagle import EagleDrafter, load_eagle_head
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import (
    Domain,
    available_domains,
    format_prompt,
    load_domain,
    read_domain_config,
)
from tss_opt.models import LoadedModel
from tss_opt.training import build_training_text, domain_text, train_eagle
from tss_opt.training.generated import chat_examples, generation_prompts, sampled_continuations


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _gen_settings(**kw: object):  # noqa: ANN202
    return settings(generated_tokens=200, sample_tokens=16, sample_temperature=0.9, **kw)


def test_sampling_is_deterministic_with_a_seed_and_reaches_the_budget(tiny64: LoadedModel) -> None:
    prompts = [torch.tensor(tiny64.tokenizer(p).input_ids) for p in ("the cat", "a dog and a", "hello there my")]
    args = dict(total_tokens=100, sample_tokens=12, temperature=0.9, batch_size=2, eos_token_ids=[EOS])
    torch.manual_seed(123)
    before = torch.rand(3)
    a = sampled_continuations(tiny64.model, prompts, seed=1, **args)
    b = sampled_continuations(tiny64.model, prompts, seed=1, **args)
    c = sampled_continuations(tiny64.model, prompts, seed=2, **args)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), before)  # the global RNG is left alone
    assert [(i, t.tolist()) for i, t in a] == [(i, t.tolist()) for i, t in b]
    assert [(i, t.tolist()) for i, t in a] != [(i, t.tolist()) for i, t in c]
    total = sum(int(t.numel()) for _, t in a)
    assert 100 <= total < 100 + 2 * 12  # stops after the batch that reaches the budget
    assert all(1 <= t.numel() <= 12 for _, t in a)
    # several rounds over the 3 prompts, every prompt continued, with different samples
    assert {i for i, _ in a} == {0, 1, 2} and len(a) >= 9
    firsts = [t.tolist() for i, t in a if i == 0]
    assert len({tuple(f) for f in firsts}) > 1


def test_generation_prompts_never_read_validation_or_heldout(tiny64: LoadedModel, toy_domain: Domain) -> None:
    dt = domain_text(toy_domain, ["calibration", "extra"])
    prompts = generation_prompts([dt], tiny64.tokenizer, chat=True)
    tok, sys_prompt = tiny64.tokenizer, toy_domain.config.system_prompt
    protected = {tuple(format_prompt(tok, ex, sys_prompt).tolist()) for s in ("validation", "heldout") for ex in toy_domain.split(s)}
    allowed = {tuple(format_prompt(tok, ex, sys_prompt).tolist()) for ex in dt.examples}
    chat = {tuple(format_prompt(tok, ex, None).tolist()) for ex in chat_examples()}
    got = {tuple(p.ids.tolist()) for p in prompts}
    assert protected and not (got & protected)
    assert got == allowed | chat
    assert {p.source for p in prompts} == {"toy/calibration", "toy/extra", "chat"}
    assert {p.source for p in generation_prompts([dt], tok, chat=False)} == {"toy/calibration", "toy/extra"}


def test_training_text_sequences_never_start_with_a_protected_prompt(
    tiny64: LoadedModel, target64: TargetModel, toy_domain: Domain, tmp_path: Path
) -> None:
    s = _gen_settings()
    dt = domain_text(toy_domain, s.sources, s.extra_prompts)
    text = build_training_text(target64, tiny64.tokenizer, [dt], s, [EOS], cache_dir=tmp_path, model_key="tiny64")
    gen = text.counts["generated"]
    assert gen["generated"] >= 200 and gen["samples"] >= 10
    sys_prompt = toy_domain.config.system_prompt
    protected = [format_prompt(tiny64.tokenizer, ex, sys_prompt).tolist() for s_ in ("validation", "heldout") for ex in toy_domain.split(s_)]
    for seq, n in zip(text.sequences, text.prompt_lengths):
        assert seq[:n].tolist() not in protected
    # the sampled part follows the domain part; the features are the dense target's
    n_dom = sum(1 for _ in text.sequences) - gen["samples"]
    seq = text.sequences[n_dom]
    want = target64.model.model(seq[None]).last_hidden_state[0].float()
    first = int(sum(int(q.numel()) for q in text.sequences[:n_dom]))
    torch.testing.assert_close(text.features.features[first : first + seq.numel()], want, atol=1e-5, rtol=0)
    # cached: a second call reads the same text back
    again = build_training_text(target64, tiny64.tokenizer, [dt], s, [EOS], cache_dir=tmp_path, model_key="tiny64")
    assert [q.tolist() for q in again.sequences] == [q.tolist() for q in text.sequences]
    assert len(list(tmp_path.glob("generated-*.pt"))) == 1


def test_shipped_chat_prompts_are_no_protected_prompt() -> None:
    """The general head trains on every domain's text plus the chat prompts: none of them
    may be a validation or held-out prompt of a shipped domain."""
    chat = chat_examples()
    assert len(chat) >= 50 and len({_norm(e.prompt) for e in chat}) == len(chat)
    protected = set()
    for name in available_domains([config_dir()]):
        d = load_domain(read_domain_config(name, [config_dir()]))
        protected |= {_norm(e.prompt) for s in ("validation", "heldout") for e in d.split(s)}
    assert protected and not ({_norm(e.prompt) for e in chat} & protected)
    path = Path(str(config_dir())).resolve().parent / "tss_opt" / "data" / "train" / "chat_prompts.jsonl"
    assert all(set(json.loads(line)) == {"id", "prompt"} for line in path.read_text().splitlines())


def test_head_trained_on_generated_text_with_a_draft_vocab_decodes_greedy(
    tiny64: LoadedModel, target64: TargetModel, toy_domain: Domain, tmp_path: Path
) -> None:
    s = _gen_settings(max_steps=8, draft_vocab=20, probe_prompts=0)
    dt = domain_text(toy_domain, s.sources, s.extra_prompts)
    text = build_training_text(target64, tiny64.tokenizer, [dt], s, [EOS])
    train_eagle(target64, text.features, s, tmp_path / "head", eos_token_ids=[EOS])
    head = load_eagle_head(tmp_path / "head", target64.model)
    assert head.draft_vocab is not None and head.draft_vocab.numel() == 20
    counts = torch.bincount(text.features.tokens, minlength=int(head.lm_head.weight.shape[0]))
    assert int(counts[head.draft_vocab].min()) >= int(counts.topk(21).values[-1])  # the most frequent ones
    drafter = EagleDrafter(head, total_tokens=12, depth=4, top_k=3)
    assert drafter.vocab_ids is not None and drafter.vocab_ids.tolist() == head.draft_vocab.tolist()
    engine = SpeculativeEngine(target64, drafter)
    accepted = 0
    for ex in toy_domain.split("heldout")[:2]:
        ids = format_prompt(tiny64.tokenizer, ex, toy_domain.config.system_prompt)
        for skip in (frozenset(), frozenset({1, 2})):
            res = engine.generate(ids, max_new_tokens=24, skip=skip)
            assert res.tokens.tolist() == greedy_dense_prefill(tiny64.model, ids, 24, skip)
            accepted += res.stats.draft_accepted
    assert accepted > 0
