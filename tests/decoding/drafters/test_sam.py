"""The suffix automaton's running match, and the SAMD drafter's choice between chain and tree."""

from __future__ import annotations

import random

import pytest
import torch

from tss_opt.decoding.drafters import (
    Drafter,
    DrafterCapabilities,
    SamdDrafter,
    SuffixAutomaton,
    VerifyFeedback,
)
from tss_opt.decoding.tree import DraftTree


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def brute_force(s: list[int]) -> tuple[int, int]:
    """Longest suffix of ``s`` that also ends at an earlier position, and the latest such end."""
    n = len(s) - 1
    best = (0, -1)
    for length in range(1, n + 1):
        suffix = s[n - length + 1 :]
        ends = [e for e in range(length - 1, n) if s[e - length + 1 : e + 1] == suffix]
        if not ends:
            break
        best = (length, max(ends))
    return best


@pytest.mark.parametrize(
    "text,expected,continuation",
    [
        ("abcd", (0, -1), ""),
        ("abcab", (2, 1), "cab"),  # "ab" ended at 1; what followed: "c", "a", "b"
        ("abcabc", (3, 2), "abc"),
        ("abcabx", (0, -1), ""),
        ("aaaa", (3, 2), "a"),  # "aaa" ended at 2 (the latest earlier end)
        ("xabyab", (2, 2), "yab"),
        ("abxab.abyab", (2, 7), "yab"),  # two earlier "ab": the latest (ending at 7) wins
        ("the cat. the c", (5, 4), "at. t"),
    ],
)
def test_hand_made_matches(text: str, expected: tuple[int, int], continuation: str) -> None:
    sam = SuffixAutomaton(ids(text))
    assert (sam.match_length, sam.match_end) == expected
    assert sam.continuation(5) == ids(continuation)


def test_running_match_equals_brute_force_on_every_prefix() -> None:
    rng = random.Random(0)
    for _ in range(200):
        alphabet = rng.randint(1, 4)
        s = [rng.randrange(alphabet) for _ in range(rng.randint(1, 50))]
        sam = SuffixAutomaton()
        for i, t in enumerate(s):
            sam.extend(t)
            assert (sam.match_length, sam.match_end) == brute_force(s[: i + 1]), s[: i + 1]
    assert len(sam) == len(s) and len(sam.length) <= 2 * len(s)  # states


def test_large_token_ids() -> None:
    sam = SuffixAutomaton([49151, 7, 30000, 49151, 7])
    assert (sam.match_length, sam.match_end) == (2, 1)
    assert sam.continuation(10) == [30000, 49151, 7]


class FixedTree(Drafter):
    """A fallback that always proposes the same tree and records what it was told."""

    capabilities = DrafterCapabilities(prefill_feedback=True)

    def __init__(self) -> None:
        self.tree = DraftTree(tokens=torch.tensor([1, 2, 3]), parents=(-1, -1, 0))
        self.updates = 0
        self.prefills = 0
        self.resets = 0

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.resets += 1

    def prefill_feedback(
        self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        self.prefills += 1

    def propose(self, context: torch.Tensor) -> DraftTree:
        return self.tree

    def update(self, feedback: VerifyFeedback) -> None:
        self.updates += 1


def test_samd_chooses_chain_or_fallback_tree() -> None:
    fb = FixedTree()
    d = SamdDrafter(threshold=3, num_tokens=4, fallback=fb)
    assert d.capabilities.prefill_feedback
    prompt = torch.tensor(ids("one two three four. one t"))
    d.reset(prompt)
    assert fb.resets == 1
    # "one t" (5 tokens) matched earlier: the chain of what followed.
    tree = d.propose(prompt)
    assert tree.is_chain and tree.tokens.tolist() == ids("wo t")
    # Committed tokens extend the automaton: "one tx" has a match of length 0.
    tree = d.propose(torch.tensor(ids("one two three four. one tx")))
    assert tree is fb.tree
    # "ur" matches "ur" of "four" (2 < threshold 3): fallback again.
    tree = d.propose(torch.tensor(ids("one two three four. one txur")))
    assert tree is fb.tree
    assert (d.sam_steps, d.fallback_steps) == (1, 2)
    d.prefill_feedback(prompt, torch.zeros(1, 5), torch.zeros(3, 2))
    d.update(
        VerifyFeedback(
            tree=fb.tree,
            accepted=(),
            committed=torch.tensor([5]),
            logits=torch.zeros(4, 5),
            hidden=torch.zeros(4, 2),
            root_token=4,
        )
    )
    assert (fb.prefills, fb.updates) == (1, 1)


def test_samd_new_request_rebuilds_the_automaton() -> None:
    d = SamdDrafter(threshold=2, num_tokens=3, fallback=FixedTree())
    d.reset(torch.tensor(ids("abcabc")))
    assert d.propose(torch.tensor(ids("abcabc"))).tokens.tolist() == ids("abc")
    d.reset(torch.tensor(ids("xyz")))
    assert len(d.sam) == 3 and (d.sam.match_length, d.sam.match_end) == (0, -1)
    # A shorter context without reset also starts over instead of reading stale tokens.
    assert d.propose(torch.tensor(ids("xy"))) is d.fallback.tree  # type: ignore[attr-defined]


def test_samd_default_fallback_is_token_recycling() -> None:
    from tss_opt.decoding.drafters import TokenRecycleDrafter

    d = SamdDrafter()
    assert isinstance(d.fallback, TokenRecycleDrafter) and len(d.fallback.template) == 15
    assert d.capabilities.prefill_feedback and (d.threshold, d.num_tokens) == (4, 10)
    with pytest.raises(ValueError, match="threshold >= 1"):
        SamdDrafter(threshold=0)
