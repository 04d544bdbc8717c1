"""EAGLE-1 head: checkpoint format, loading errors, tree drafting against a cache-free
recomputation, and the engine plumbing (features from the possibly sparse target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tss_opt.decoding.drafters import (
    EagleDrafter,
    EagleHead,
    EagleHeadError,
    build_drafter,
    load_eagle_head,
    random_eagle_head,
    save_eagle_head,
)
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models import LoadedModel

EOS = 258
EAGLE1_KEYS = {
    "fc.weight",
    "fc.bias",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


@pytest.fixture(scope="module")
def prompt(tiny: LoadedModel) -> torch.Tensor:
    return torch.tensor(
        tiny.tokenizer("the cat sat on the mat. the dog", add_special_tokens=False).input_ids
    )


@pytest.fixture()
def saved(tiny: LoadedModel, tmp_path: Path) -> Path:
    return save_eagle_head(random_eagle_head(tiny.model, seed=3), tmp_path / "head")


# ----------------------------------------------------------------------------- the head
def test_random_head_has_eagle1_layout_and_shares_target_modules(tiny: LoadedModel) -> None:
    head = random_eagle_head(tiny.model, seed=0)
    assert set(head.state_dict()) == EAGLE1_KEYS  # no embed_tokens / lm_head copies
    assert head.embed_tokens is tiny.model.get_input_embeddings()
    assert head.lm_head is tiny.model.get_output_embeddings()
    assert tuple(head.fc.weight.shape) == (64, 128) and head.fc.weight.dtype == torch.float64
    assert isinstance(head.layers[0].input_layernorm, torch.nn.Identity)  # EAGLE-1: none on layer 0
    again = random_eagle_head(tiny.model, seed=0)
    other = random_eagle_head(tiny.model, seed=1)
    assert torch.equal(head.fc.weight, again.fc.weight) and not torch.equal(
        head.fc.weight, other.fc.weight
    )


def _forward(head: EagleHead, tiny: LoadedModel, prompt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        feats = tiny.model.model(input_ids=prompt[None]).last_hidden_state  # [1, P, H]
        n = prompt.numel() - 1
        return head(prompt[None, 1:], feats[:, :n], torch.arange(n)[None])


@pytest.mark.parametrize("include_embeddings", [False, True])
def test_save_load_round_trip(
    tiny: LoadedModel, prompt: torch.Tensor, tmp_path: Path, include_embeddings: bool
) -> None:
    head = random_eagle_head(tiny.model, seed=3)
    path = save_eagle_head(head, tmp_path / "head", include_embeddings=include_embeddings)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "pytorch_model.bin"]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 1 and cfg["bias"] is True
    state = torch.load(path / "pytorch_model.bin", weights_only=True)
    assert set(state) == EAGLE1_KEYS | ({"embed_tokens.weight"} if include_embeddings else set())
    loaded = load_eagle_head(path, TargetModel(tiny.model))  # a TargetModel works as well
    for k, v in head.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert loaded.embed_tokens is tiny.model.get_input_embeddings()
    torch.testing.assert_close(
        _forward(loaded, tiny, prompt), _forward(head, tiny, prompt), rtol=0, atol=0
    )


def test_missing_directory_and_files(tiny: LoadedModel, saved: Path, tmp_path: Path) -> None:
    with pytest.raises(EagleHeadError, match=r"directory .*nowhere not found.*random_init"):
        load_eagle_head(tmp_path / "nowhere", tiny.model)
    (saved / "pytorch_model.bin").unlink()
    with pytest.raises(
        EagleHeadError, match=r"no EAGLE head weights in .*head: expected pytorch_model.bin"
    ):
        load_eagle_head(saved, tiny.model)
    (saved / "config.json").unlink()
    with pytest.raises(EagleHeadError, match=r"config .*head/config.json not found"):
        load_eagle_head(saved, tiny.model)


def test_config_that_does_not_fit_the_target(tiny: LoadedModel, saved: Path) -> None:
    cfg = json.loads((saved / "config.json").read_text())
    cfg["hidden_size"] = 4096
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        EagleHeadError,
        match=r"config.json: the head has hidden_size=4096.*target has hidden_size=64, vocab_size=259",
    ):
        load_eagle_head(saved, tiny.model)
    (saved / "config.json").write_text("{broken")
    with pytest.raises(EagleHeadError, match="config.json is not valid JSON"):
        load_eagle_head(saved, tiny.model)


def _edit_weights(saved: Path, edit) -> None:  # type: ignore[no-untyped-def]
    state = torch.load(saved / "pytorch_model.bin", weights_only=True)
    edit(state)
    torch.save(state, saved / "pytorch_model.bin")


def test_weights_that_do_not_fit(tiny: LoadedModel, saved: Path) -> None:
    _edit_weights(
        saved, lambda s: s.__setitem__("layers.0.mlp.gate_proj.weight", torch.zeros(100, 64))
    )
    with pytest.raises(
        EagleHeadError,
        match=r"pytorch_model.bin does not fit the head built from .*config.json.*"
        r"layers.0.mlp.gate_proj.weight: checkpoint \(100, 64\) vs expected \(128, 64\)",
    ):
        load_eagle_head(saved, tiny.model)
    _edit_weights(
        saved, lambda s: s.__setitem__("layers.0.mlp.gate_proj.weight", torch.zeros(128, 64))
    )
    _edit_weights(saved, lambda s: s.__setitem__("embed_tokens.weight", torch.zeros(32000, 64)))
    with pytest.raises(
        EagleHeadError, match=r"embed_tokens.weight: checkpoint \(32000, 64\) vs target \(259, 64\)"
    ):
        load_eagle_head(saved, tiny.model)
    _edit_weights(saved, lambda s: s.pop("embed_tokens.weight"))
    load_eagle_head(saved, tiny.model)  # fits again


def test_missing_foreign_and_eagle3_keys(tiny: LoadedModel, saved: Path) -> None:
    _edit_weights(saved, lambda s: s.pop("layers.0.self_attn.q_proj.weight"))
    with pytest.raises(
        EagleHeadError,
        match=r"pytorch_model.bin lacks 1 head weight\(s\): layers.0.self_attn.q_proj.weight",
    ):
        load_eagle_head(saved, tiny.model)
    _edit_weights(
        saved, lambda s: s.__setitem__("layers.0.self_attn.q_proj.weight", torch.zeros(64, 64))
    )
    _edit_weights(
        saved, lambda s: s.__setitem__("layers.1.mlp.up_proj.weight", torch.zeros(128, 64))
    )
    with pytest.raises(
        EagleHeadError,
        match=r"does not own: layers.1.mlp.up_proj.weight; check config.json's num_hidden_layers",
    ):
        load_eagle_head(saved, tiny.model)
    _edit_weights(saved, lambda s: s.__setitem__("d2t", torch.zeros(3)))
    with pytest.raises(EagleHeadError, match="looks like an EAGLE-3 head"):
        load_eagle_head(saved, tiny.model)


def test_head_without_fc_bias_loads(tiny: LoadedModel, saved: Path) -> None:
    _edit_weights(saved, lambda s: s.pop("fc.bias"))
    head = load_eagle_head(saved, tiny.model)
    assert not head.has_bias


# ----------------------------------------------------------------------------- drafting
@torch.inference_mode()
def path_score(
    head: EagleHead, context: torch.Tensor, feats: torch.Tensor, path: list[int]
) -> float:
    """Cumulative log-probability of ``path`` below ``context[-1]``, recomputing the head over
    the whole pair sequence (no cache, causal) for every step."""
    n_pairs = context.numel() - 1
    seq_ids = context[1:].tolist()
    seq_feats = list(feats[:n_pairs])
    out = head(torch.tensor([seq_ids]), torch.stack(seq_feats)[None], torch.arange(n_pairs)[None])
    h = out[0, -1]
    score = 0.0
    for tok in path:
        score += float(torch.log_softmax(head.lm_head(h), dim=-1)[tok])
        seq_ids.append(tok)
        seq_feats.append(h)
        out = head(
            torch.tensor([seq_ids]), torch.stack(seq_feats)[None], torch.arange(len(seq_ids))[None]
        )
        h = out[0, -1]
    return score


class CheckedEagle(EagleDrafter):
    """Checks every proposed tree against the cache-free recomputation."""

    checked = 0

    def propose(self, context: torch.Tensor) -> DraftTree:
        assert self.num_features == context.numel() - 1
        tree = super().propose(context)
        assert len(tree) == self.total_tokens - 1
        assert self.last_scores is not None and self._features is not None
        for node in range(len(tree)):
            path = [node]
            while tree.parents[path[-1]] != -1:
                path.append(tree.parents[path[-1]])
            toks = [int(tree.tokens[i]) for i in reversed(path)]
            want = path_score(self.head, context, self._features, toks)
            assert abs(float(self.last_scores[node]) - want) < 1e-9, (node, toks)
        CheckedEagle.checked += 1
        return tree


@pytest.mark.parametrize("skip,scope", [(frozenset(), "verify"), (frozenset({1, 2}), "all")])
def test_drafted_tree_scores_match_cache_free_head(
    tiny: LoadedModel, prompt: torch.Tensor, skip: frozenset[int], scope: str
) -> None:
    CheckedEagle.checked = 0
    drafter = CheckedEagle(random_eagle_head(tiny.model, seed=1), total_tokens=20, depth=4, top_k=3)
    target = TargetModel(tiny.model)
    res = SpeculativeEngine(target, drafter, eos_token_ids=[EOS]).generate(
        prompt, max_new_tokens=6, skip=skip, scope=scope
    )
    assert CheckedEagle.checked == res.stats.steps >= 3


def test_tree_shape_budget_and_depth(tiny: LoadedModel, prompt: torch.Tensor) -> None:
    drafter = EagleDrafter(random_eagle_head(tiny.model, seed=0), total_tokens=60, depth=6, top_k=8)
    target = TargetModel(tiny.model)
    drafter.reset(prompt)
    with torch.inference_mode():
        logits, hidden = target.prefill(prompt, target.new_cache())
    drafter.prefill_feedback(prompt, logits, hidden)
    tree = drafter.propose(torch.cat([prompt, logits[-1].argmax().reshape(1)]))
    assert len(tree) == 59 and max(tree.depth) <= 6
    assert sum(1 for p in tree.parents if p == -1) <= 8
    assert sum(1 for k in tree.children() if len(k) > 1) >= 3  # really a tree
    scores = drafter.last_scores
    assert scores is not None
    for i, p in enumerate(tree.parents):  # a child is never more likely than its parent
        assert p == -1 or scores[i] <= scores[p]


def test_features_come_from_the_sparse_target(tiny: LoadedModel, prompt: torch.Tensor) -> None:
    drafter = EagleDrafter(random_eagle_head(tiny.model, seed=0))
    target = TargetModel(tiny.model)
    SpeculativeEngine(target, drafter, eos_token_ids=[EOS]).generate(
        prompt, max_new_tokens=1, skip={1, 2}, scope="all"
    )
    with torch.inference_mode(), target.skip({1, 2}):
        sparse = tiny.model.model(input_ids=prompt[None]).last_hidden_state[0]
    dense = tiny.model.model(input_ids=prompt[None]).last_hidden_state[0].detach()
    assert drafter._features is not None
    torch.testing.assert_close(drafter._features, sparse)
    assert not torch.allclose(drafter._features, dense)


def test_propose_without_features_is_an_error(tiny: LoadedModel, prompt: torch.Tensor) -> None:
    drafter = EagleDrafter(random_eagle_head(tiny.model, seed=0))
    drafter.reset(prompt)
    with pytest.raises(
        RuntimeError, match=r"holds target features for 0 tokens but the context has \d+"
    ):
        drafter.propose(prompt)
    with pytest.raises(ValueError, match="total_tokens >= 2"):
        EagleDrafter(random_eagle_head(tiny.model, seed=0), total_tokens=1)


def test_engine_with_random_head_is_lossless(
    tiny: LoadedModel, prompt: torch.Tensor, saved: Path
) -> None:
    target = TargetModel(tiny.model)
    drafter = build_drafter({"name": "eagle", "path": str(saved), "total_tokens": 60}, target, tiny)
    assert isinstance(drafter, EagleDrafter)
    res = SpeculativeEngine(target, drafter, eos_token_ids=[EOS]).generate(
        prompt, max_new_tokens=24
    )
    want = tiny.model.generate(
        prompt[None], max_new_tokens=24, do_sample=False, eos_token_id=EOS, pad_token_id=EOS
    )[0, prompt.numel() :]
    assert res.tokens.tolist() == want.tolist()
    # 59 nodes per step, except the last few steps, whose trees lose the levels past the
    # tokens left to generate (depth 6: at most 6 such steps; tss_opt/decoding/budget.py).
    s = res.stats
    assert s.accept_length >= 1.0 and 59 * (s.steps - 6) <= s.draft_proposed < 59 * s.steps


@pytest.mark.slow
def test_embedded_model_round_trip(embedded: LoadedModel, tmp_path: Path) -> None:
    head = random_eagle_head(embedded.model, seed=0)
    assert tuple(head.fc.weight.shape) == (576, 1152)
    path = save_eagle_head(head, tmp_path / "smol_head")
    loaded = load_eagle_head(path, embedded.model)
    for k, v in head.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    ids = embedded.tokenizer("The capital of Australia is", return_tensors="pt").input_ids[0]
    with torch.inference_mode():
        feats = embedded.model.model(input_ids=ids[None]).last_hidden_state
        n = ids.numel() - 1
        a = head(ids[None, 1:], feats[:, :n], torch.arange(n)[None])
        b = loaded(ids[None, 1:], feats[:, :n], torch.arange(n)[None])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
