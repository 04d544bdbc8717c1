"""What sizing measures through the engine: a drafter's acceptance by depth and rank
(:func:`measure_acceptance`) and its draft cost (:func:`draft_seconds_per_token`,
:func:`draft_seconds_per_level`), each on short greedy runs. The verification-latency tables
are :mod:`tss_opt.decoding.sizing.latency`'s; the choice itself is pure
(:mod:`tss_opt.decoding.sizing.choice`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from tss_opt.decoding.drafter import Drafter, VerifyFeedback
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.sizing.choice import AcceptanceProfile, sibling_ranks
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = [
    "AcceptanceCounter", "ProfilingDrafter", "draft_seconds_per_level", "draft_seconds_per_token",
    "measure_acceptance",
]


class AcceptanceCounter:
    """Counts, per (depth, rank), how often a node whose parent was accepted (or is the root)
    is the target's greedy next token, and how many steps had a draft at all. Fed by
    :class:`ProfilingDrafter`."""

    def __init__(self, max_depth: int = 8, max_rank: int = 8) -> None:
        self.hits = torch.zeros(max_depth, max_rank, dtype=torch.long)
        self.trials = torch.zeros(max_depth, max_rank, dtype=torch.long)
        self.steps = 0
        self.proposals = 0

    def observe(self, tree: DraftTree, logits: torch.Tensor, accepted: Sequence[int]) -> None:
        """``logits``: ``(n + 1, vocab)`` rows ``[root, node_0, ...]``."""
        self.steps += 1
        if not len(tree):
            return
        self.proposals += 1
        target_next = logits.argmax(dim=-1).cpu()  # [n + 1]
        reached = {-1, *accepted}  # nodes whose children the target really continued from
        ranks = sibling_ranks(tree)
        D, R = self.hits.shape
        for i, (p, d, r) in enumerate(zip(tree.parents, tree.depth, ranks, strict=True)):
            if p not in reached or d > D or r >= R:
                continue
            self.trials[d - 1, r] += 1
            self.hits[d - 1, r] += int(int(tree.tokens[i]) == int(target_next[p + 1]))

    def profile(self, name: str = "measured", pseudo_trials: float = 8.0) -> AcceptanceProfile:
        """Hit rates shrunk towards the row above: ``(hits + k * above) / (trials + k)`` with
        ``k = pseudo_trials`` (depth 1 shrinks towards 0). Why: deep cells are reached only
        through accepted paths, so a few bursty prompts (a copied span that matches whole)
        give them a handful of trials; a raw 5/5 = 1.00 there made a 10-token prompt-lookup
        chain look like 3.4 tokens per step on calibration prompts where it gave 1.95 on the
        next ones. A cell with many trials keeps its measured rate."""
        rows: list[tuple[float, ...]] = []
        k = float(pseudo_trials)
        for d in range(self.hits.shape[0]):
            row = []
            for r in range(self.hits.shape[1]):
                above = rows[-1][r] if rows else 0.0
                h, t = float(self.hits[d, r]), float(self.trials[d, r])
                row.append((h + k * above) / (t + k) if t + k > 0 else above)
            rows.append(tuple(row))
        rate = self.proposals / self.steps if self.steps else 1.0
        return AcceptanceProfile(rank_accept=tuple(rows), name=name, proposal_rate=rate)


class ProfilingDrafter(Drafter):
    """Wraps a drafter and records its acceptance by depth and rank; drafts unchanged."""

    def __init__(self, inner: Drafter, counter: AcceptanceCounter) -> None:
        self.inner, self.counter = inner, counter
        self.capabilities = inner.capabilities  # drafts unchanged, so it can what the inner can

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.inner.reset(prompt_ids)

    def propose(self, context: torch.Tensor) -> DraftTree:
        return self.inner.propose(context)

    def propose_within(self, context: torch.Tensor, max_depth: int) -> DraftTree:
        return self.inner.propose_within(context, max_depth)

    def prefill_feedback(self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        self.inner.prefill_feedback(prompt_ids, logits, hidden)

    def update(self, feedback: VerifyFeedback) -> None:
        self.counter.observe(feedback.tree, feedback.logits, feedback.accepted)
        self.inner.update(feedback)


def measure_acceptance(
    target: TargetModel,
    drafter: Drafter,
    prompts: Sequence[torch.Tensor],
    *,
    max_new_tokens: int = 32,
    max_depth: int = 8,
    max_rank: int = 8,
    name: str = "measured",
) -> AcceptanceProfile:
    """Greedy-decode the calibration ``prompts`` with ``drafter`` (use a wide, deep template so
    every (depth, rank) cell is tried) and return its acceptance profile."""
    counter = AcceptanceCounter(max_depth, max_rank)
    engine = SpeculativeEngine(target, ProfilingDrafter(drafter, counter))
    for prompt in prompts:
        engine.generate(prompt, max_new_tokens=max_new_tokens)
    return counter.profile(name=name)


def _short_run(target: TargetModel, drafter: Drafter, new_tokens: int) -> DecodeStats:
    """The statistics of a short greedy run with ``drafter`` on a fixed random 32-token prompt,
    after a 2-token warm-up (what draft costs are timed on)."""
    vocab = int(target.model.config.vocab_size)
    prompt = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(0))
    engine = SpeculativeEngine(target, drafter)
    engine.generate(prompt, max_new_tokens=2)
    return engine.generate(prompt, max_new_tokens=new_tokens).stats


def draft_seconds_per_level(target: TargetModel, drafter: Drafter, *, depth: int, new_tokens: int = 8) -> float:
    """Seconds per drafted level of a tree drafter that pays per level (EAGLE: one head forward
    and one ``lm_head`` projection per level): its draft time per step over a short greedy run,
    divided by ``depth``."""
    stats = _short_run(target, drafter, new_tokens)
    return stats.draft_s / max(1, stats.steps) / depth


def draft_seconds_per_token(target: TargetModel, drafter: Drafter, *, new_tokens: int = 8) -> float:
    """Seconds per drafted token of a model-drafted chain (one draft-model forward each): its
    draft time over a short greedy run, divided by the tokens it proposed."""
    stats = _short_run(target, drafter, new_tokens)
    return stats.draft_s / max(1, stats.draft_proposed)
