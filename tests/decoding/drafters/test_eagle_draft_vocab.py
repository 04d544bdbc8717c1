"""EAGLE's draft vocabulary (FR-Spec): the head carries target ids, the drafter
projects onto them only and maps its choices back; checkpoints with and without one load;
decoding stays exactly greedy (and exactly plain sampling with a seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.drafters import (
    EagleDrafter,
    build_drafter,
    load_eagle_head,
    random_eagle_head,
    save_eagle_head,
)
from tss_opt.decoding.drafters.eagle import frequent_tokens
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.models import LoadedModel

EOS = 258


@pytest.fixture(scope="module")
def prompt(tiny: LoadedModel) -> torch.Tensor:
    return torch.tensor(tiny.tokenizer("the cat sat on the mat. the dog", add_special_tokens=False).input_ids)


def _vocab(prompt: torch.Tensor, n: int = 24) -> torch.Tensor:
    """A small draft vocabulary: the prompt's tokens first, then other ids (distinct)."""
    ids = list(dict.fromkeys(prompt.tolist()))
    ids += [t for t in range(256) if t not in ids]
    return torch.tensor(ids[:n])


def _features(drafter: EagleDrafter, target: TargetModel, prompt: torch.Tensor) -> None:
    """Give the drafter the target's features of the prompt but its last token (the context
    then ends with a token not yet run through the target, as the engine's bonus token)."""
    hidden = target.model.model(prompt[None, :-1]).last_hidden_state[0]
    drafter.reset(prompt[:-1])
    drafter.prefill_feedback(prompt[:-1], None, hidden)  # type: ignore[arg-type]


def test_frequent_tokens_order_and_ties() -> None:
    tokens = torch.tensor([5, 3, 5, 9, 3, 5, 7, 1, 1])
    # 5 three times; 1 and 3 twice (the smaller id first); 7 and 9 once
    assert frequent_tokens(tokens, 10).tolist() == [5, 1, 3, 7, 9]
    assert frequent_tokens(tokens, 2).tolist() == [5, 1]


def test_head_refuses_a_draft_vocabulary_outside_the_target(tiny: LoadedModel) -> None:
    head = random_eagle_head(tiny.model, seed=0)
    vocab = int(tiny.model.get_output_embeddings().weight.shape[0])
    with pytest.raises(ValueError, match=rf"distinct token ids in \[0, {vocab}\)"):
        head.set_draft_vocab(torch.tensor([1, vocab]))
    with pytest.raises(ValueError, match="1 repeated"):
        head.set_draft_vocab(torch.tensor([1, 2, 2]))


def test_checkpoint_round_trip_with_and_without_a_draft_vocabulary(tiny: LoadedModel, prompt: torch.Tensor, tmp_path: Path) -> None:
    head = random_eagle_head(tiny.model, seed=1)
    old = save_eagle_head(head, tmp_path / "old")  # the format before the draft vocabulary: no draft_vocab
    assert "draft_vocab" not in torch.load(old / "pytorch_model.bin") and "draft_vocab_size" not in json.loads((old / "config.json").read_text())
    assert load_eagle_head(old, tiny.model).draft_vocab is None
    head.set_draft_vocab(_vocab(prompt))
    new = save_eagle_head(head, tmp_path / "new")
    assert json.loads((new / "config.json").read_text())["draft_vocab_size"] == 24
    loaded = load_eagle_head(new, tiny.model)
    assert loaded.draft_vocab.tolist() == _vocab(prompt).tolist()
    for k, v in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)


def test_drafts_come_from_the_draft_vocabulary(tiny: LoadedModel, prompt: torch.Tensor) -> None:
    target = TargetModel(tiny.model)
    head = random_eagle_head(tiny.model, seed=2)
    head.set_draft_vocab(_vocab(prompt, 12))
    drafter = EagleDrafter(head, total_tokens=20, depth=4, top_k=4, draft_vocab=5)
    _features(drafter, target, prompt)
    tree = drafter.propose(prompt)
    assert len(tree.tokens) == 19
    assert set(tree.tokens.tolist()) <= set(_vocab(prompt, 5).tolist())


def test_a_draft_vocabulary_of_every_token_drafts_the_full_vocabulary_tree(tiny: LoadedModel, prompt: torch.Tensor) -> None:
    """The restricted projection and the mapping back are exact: a permutation of the whole
    vocabulary as the draft vocabulary gives the very tree (tokens, parents, scores) of the
    full-vocabulary head."""
    target = TargetModel(tiny.model)
    vocab = int(tiny.model.get_output_embeddings().weight.shape[0])
    plain = random_eagle_head(tiny.model, seed=4)
    permuted = random_eagle_head(tiny.model, seed=4)
    permuted.set_draft_vocab(torch.randperm(vocab, generator=torch.Generator().manual_seed(0)))
    trees = []
    for head in (plain, permuted):
        drafter = EagleDrafter(head, total_tokens=30, depth=5, top_k=4)
        _features(drafter, target, prompt)
        trees.append((drafter.propose(prompt), drafter.last_scores))
    (a, sa), (b, sb) = trees
    assert a.tokens.tolist() == b.tokens.tolist() and a.parents == b.parents
    torch.testing.assert_close(sa, sb, atol=1e-5, rtol=0)
    # and a small draft vocabulary does change the tree (the comparison can fail)
    small = random_eagle_head(tiny.model, seed=4)
    small.set_draft_vocab(_vocab(prompt, 8))
    drafter = EagleDrafter(small, total_tokens=30, depth=5, top_k=4)
    _features(drafter, target, prompt)
    assert drafter.propose(prompt).tokens.tolist() != a.tokens.tolist()


def test_node_distributions_are_zero_outside_the_draft_vocabulary(tiny: LoadedModel, prompt: torch.Tensor) -> None:
    target = TargetModel(tiny.model)
    head = random_eagle_head(tiny.model, seed=5)
    ids = _vocab(prompt, 10)
    head.set_draft_vocab(ids)
    drafter = EagleDrafter(head, total_tokens=12, depth=3, top_k=3, return_probs=True)
    _features(drafter, target, prompt)
    probs = drafter.propose(prompt).probs  # [n, V]
    vocab = int(tiny.model.get_output_embeddings().weight.shape[0])
    assert probs is not None and probs.shape == (11, vocab)
    torch.testing.assert_close(probs.sum(-1), torch.ones(11), atol=1e-5, rtol=0)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[ids] = False
    assert float(probs[:, outside].abs().max()) == 0.0 and float(probs[:, ids].min()) > 0.0


@pytest.mark.parametrize("draft_vocab", [None, 6, 0])
def test_decoding_with_a_draft_vocabulary_is_greedy_and_plain_sampling(
    tiny: LoadedModel, prompt: torch.Tensor, tmp_path: Path, draft_vocab: int | None
) -> None:
    """Greedy: exactly plain greedy's tokens; seeded sampling: exactly plain sampling's (EAGLE's
    drafts are deterministic, so the coupled rule commits plain sampling's tokens), dense and
    with a skip set."""
    head = random_eagle_head(tiny.model, seed=6)
    head.set_draft_vocab(_vocab(prompt, 16))
    path = save_eagle_head(head, tmp_path / "head")
    target = TargetModel(tiny.model)
    drafter = build_drafter(
        {"name": "eagle", "checkpoint": str(path), "total_tokens": 16, "depth": 4, "top_k": 4, "draft_vocab": draft_vocab},
        target, tiny,
    )
    assert isinstance(drafter, EagleDrafter)
    assert (drafter.vocab_ids is None) == (draft_vocab == 0)
    engine = SpeculativeEngine(target, drafter, eos_token_ids=[EOS])
    want = tiny.model.generate(prompt[None], max_new_tokens=24, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)[0, prompt.numel() :]
    res = engine.generate(prompt, max_new_tokens=24)
    assert res.tokens.tolist() == want.tolist() and res.stats.draft_proposed > 0
    for skip in ((), (1,)):
        plain = SpeculativeEngine(target, eos_token_ids=[EOS]).generate(prompt, max_new_tokens=24, skip=skip, temperature=0.7, seed=5)
        spec = engine.generate(prompt, max_new_tokens=24, skip=skip, temperature=0.7, seed=5)
        assert spec.tokens.tolist() == plain.tokens.tolist()


def test_draft_vocab_setting_errors(tiny: LoadedModel, tmp_path: Path) -> None:
    path = save_eagle_head(random_eagle_head(tiny.model, seed=0), tmp_path / "old")
    target = TargetModel(tiny.model)
    with pytest.raises(DrafterConfigError, match="carries no draft vocabulary"):
        build_drafter({"name": "eagle", "checkpoint": str(path), "draft_vocab": 100}, target, tiny)
    with pytest.raises(DrafterConfigError, match=r"drafter.draft_vocab=-1 is invalid"):
        build_drafter({"name": "eagle", "checkpoint": str(path), "draft_vocab": -1}, target, tiny)
    # an old head with the default (null) or 0 drafts over the whole vocabulary
    for n in (None, 0):  # a fixed tree: a sized one may be NoDrafter on a busy machine
        d = build_drafter({"name": "eagle", "checkpoint": str(path), "draft_vocab": n, "total_tokens": 8}, target, tiny)
        assert isinstance(d, EagleDrafter) and d.vocab_ids is None
