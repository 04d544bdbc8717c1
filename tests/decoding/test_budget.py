"""Drafts within budget: no draft node is verified past the target's context
or past the tokens left to generate, and greedy outputs stay plain greedy decoding's."""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding import engine as engine_module
from tss_opt.decoding.budget import draft_depth_limit, prune_depth
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities
from tss_opt.decoding.drafters import (
    DraftModelDrafter,
    EagleDrafter,
    PromptLookupDrafter,
    SelfDrafter,
    TokenRecycleDrafter,
    random_eagle_head,
)
from tss_opt.decoding.drafters.taps import MergedDrafter, RoutedDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree

# 256 bytes of repetitive text: prompt lookup finds long continuations everywhere.
PROMPT_TEXT = ("the cat sat on the mat. the dog sat on the log. " * 6)[:256]


class WideTree(Drafter):
    """A full binary tree of depth 5 (62 nodes) built from recent context tokens: deep enough
    that the budget always prunes it near the end."""

    capabilities = DrafterCapabilities(confidence=True)

    def propose(self, context: torch.Tensor) -> DraftTree:
        parents, tokens = [], []
        level = [-1]
        for d in range(5):
            nxt = []
            for p in level:
                for b in range(2):
                    parents.append(p)
                    tokens.append(int(context[-(1 + (d + b) % len(context))]))
                    nxt.append(len(parents) - 1)
            level = nxt
        return DraftTree(tokens=torch.tensor(tokens), parents=tuple(parents), confidence=torch.full((len(tokens),), 0.5))


class Recording(TargetModel):
    """Records, per verification forward, the root's position and the tree's depth."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[int, int]] = []

    def verify_forward(self, root_token, tree, cache, prefix_len):
        self.steps.append((prefix_len, max(tree.depth, default=0)))
        return super().verify_forward(root_token, tree, cache, prefix_len)


def drafters(tiny):
    return {
        "pld": lambda: PromptLookupDrafter(num_tokens=10),
        "wide_tree": WideTree,
        "token_recycle": lambda: TokenRecycleDrafter(keep_table=False),
        "draft_model": lambda: DraftModelDrafter(tiny.model, num_tokens=10),  # the target itself: always right
        "self": lambda: SelfDrafter(tiny.model, skip=[1, 2], num_tokens=10),
        "eagle": lambda: EagleDrafter(random_eagle_head(tiny.model, seed=0), total_tokens=30, depth=8),
        "merged": lambda: MergedDrafter([("pld", PromptLookupDrafter(num_tokens=10)), ("wide", WideTree())]),
        "routed": lambda: RoutedDrafter([("pld", PromptLookupDrafter(num_tokens=10)), ("wide", WideTree())]),
    }


@pytest.fixture(scope="module")
def prompt(tiny) -> torch.Tensor:
    ids = tiny.tokenizer(PROMPT_TEXT, return_tensors="pt").input_ids[0]
    assert len(ids) == 256
    return ids


def test_depth_limit_by_hand():
    assert draft_depth_limit(prefix_len=256, tokens_left=8, max_context=265) == 7  # tokens bind
    assert draft_depth_limit(prefix_len=260, tokens_left=20, max_context=265) == 4  # context binds
    assert draft_depth_limit(prefix_len=100, tokens_left=1, max_context=2048) == 0  # last token: no draft
    assert draft_depth_limit(prefix_len=264, tokens_left=5, max_context=265) == 0


def test_prune_keeps_shallow_nodes_with_their_rows():
    #        root
    #       0    1
    #      2 3   4
    #      5
    parents = (-1, -1, 0, 0, 1, 2)
    tree = DraftTree(
        tokens=torch.tensor([10, 11, 12, 13, 14, 15]), parents=parents,
        probs=torch.eye(6), confidence=torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4, 0.5]),
    )
    assert prune_depth(tree, 3) is tree
    two = prune_depth(tree, 2)
    assert two.tokens.tolist() == [10, 11, 12, 13, 14] and two.parents == (-1, -1, 0, 0, 1)
    assert torch.equal(two.probs, torch.eye(6)[:5]) and two.confidence.tolist() == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    # A pruned node in the middle of the order: later links are renumbered.
    tree = DraftTree(tokens=torch.tensor([1, 2, 3, 4]), parents=(-1, 0, -1, 2))
    one = prune_depth(tree, 1)
    assert one.tokens.tolist() == [1, 3] and one.parents == (-1, -1)
    assert len(prune_depth(tree, 0)) == 0


@pytest.mark.parametrize("name", ["pld", "wide_tree", "token_recycle", "draft_model", "self", "eagle", "merged", "routed"])
def test_drafts_stay_inside_context_and_token_budget(tiny, prompt, name):
    # The issue's case: a 256-token prompt, max_context 265, 8 new tokens (256 + 8 + 1 = 265 fits).
    target = Recording(tiny.model, max_context=265)
    plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=8).tokens.tolist()
    for max_new in (8, 3, 1):
        target.steps.clear()
        out = SpeculativeEngine(target, drafters(tiny)[name]()).generate(prompt, max_new_tokens=max_new)
        assert out.tokens.tolist() == plain[:max_new]
        for prefix_len, depth in target.steps:
            assert prefix_len + depth <= 264, f"a draft node at position {prefix_len + depth} (max_context 265)"
            n_out = prefix_len - len(prompt) + 1  # tokens committed before this step
            assert depth <= max_new - n_out - 1, "drafted past the tokens left to generate"


def test_without_the_cap_the_issue_case_overflows(tiny, prompt, monkeypatch):
    """Shows the test above can fail: uncapped, a 10-token chain drafted after the 256-token
    prompt is verified at positions up to 266 (the random model's greedy text gives prompt
    lookup no long match, so the chain comes from the model itself, which always drafts 10)."""
    monkeypatch.setattr(engine_module, "draft_depth_limit", lambda *a: 10**9)
    target = Recording(tiny.model, max_context=265)
    SpeculativeEngine(target, DraftModelDrafter(tiny.model, num_tokens=10)).generate(prompt, max_new_tokens=8)
    assert target.steps[0] == (256, 10) and max(p + d for p, d in target.steps) == 266


@pytest.mark.parametrize("name", ["pld", "wide_tree", "token_recycle", "draft_model", "self", "eagle", "merged", "routed"])
@pytest.mark.parametrize(("skip", "scope"), [((), "verify"), ((1,), "all"), ((2,), "verify")])
def test_greedy_outputs_equal_plain_decoding_at_every_budget(tiny, name, skip, scope):
    ids = tiny.tokenizer("the cat sat on the mat. the cat sat on the hat. the dog", return_tensors="pt").input_ids[0]
    target = TargetModel(tiny.model)
    plain = SpeculativeEngine(target).generate(ids, max_new_tokens=20, skip=skip, scope=scope).tokens.tolist()
    for max_new in (1, 2, 5, 20):
        out = SpeculativeEngine(target, drafters(tiny)[name]()).generate(ids, max_new_tokens=max_new, skip=skip, scope=scope)
        assert out.tokens.tolist() == plain[:max_new]
        assert out.stats.new_tokens == len(out.tokens) <= max_new


def test_a_draft_model_pays_no_forward_past_the_budget(tiny, prompt):
    calls = []
    drafter = DraftModelDrafter(tiny.model, num_tokens=10)
    real = drafter._forward
    drafter._forward = lambda ids: calls.append(int(ids.shape[-1])) or real(ids)
    SpeculativeEngine(TargetModel(tiny.model), drafter).generate(prompt, max_new_tokens=3)
    # The prefill commits 1 token, so the one step may draft 3 - 1 - 1 = 1 token: the prompt's
    # forward gives it; accepted plus the bonus makes 3, done. Uncapped: 1 + 9 forwards.
    assert calls == [len(prompt) + 1]
