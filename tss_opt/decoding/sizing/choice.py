"""The tree choice, a pure function of a latency table and an acceptance profile (Sequoia's
idea, Chen et al. 2024, arXiv 2402.12374). Nothing here measures or reads files.

:func:`choose_tree` picks the tree (size, depth, branching; a plain chain; or no speculation at
all) maximising expected tokens per second::

    rate(T) = (1 + m * sum_{v in T} prod_{u on path(v)} p(depth(u), rank(u)))
              / (m * (draft_s(T) + latency(|T|)) + (1 - m) * latency(0))

The ``1`` is the target's bonus/correction token, committed by every step; ``latency(0)`` is a
plain decoding step, so the empty tree is "no speculation" and wins when verifying any tree
costs more than it returns (this 2-core CPU after a long context), while a wide tree wins where
verifying 64 nodes costs about one token (a GPU). ``m`` is the profile's proposal rate: the
share of steps at which the drafter proposes anything (1 for tree drafters; prompt lookup has
nothing to propose when the context holds no match, and such a step costs a plain step and
commits one token).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tss_opt.decoding.sizing.latency import LatencyTable, TreeSizingError
from tss_opt.decoding.templates import TreeTemplate
from tss_opt.decoding.tree import DraftTree

SPECULATION_MARGIN = 0.10
"""How much faster than plain decoding a tree must be expected to be before it is chosen
(10 %): the expected rate is a model (acceptance measured on a few calibration prompts, each
latency a median), and where its gain is within that model's error a tree can lose while
plain decoding costs nothing. Measured before the margin (benchmarks/decode.py, float32,
771-token prompts): prompt lookup sized to 7 nodes for an expected 4 % gain ran at 0.85x plain."""

__all__ = [
    "COPY_CHAIN_PRIOR", "MODEL_CHAIN_PRIOR", "RANK_PRIOR", "SPECULATION_MARGIN", "AcceptanceProfile", "Prior", "TreeChoice", "best_tree", "choose_tree",
    "sibling_ranks",
]

Prior = tuple[tuple[float, ...], ...]
"""An acceptance prior: rows = depths 1, 2, ... (the last row holds for deeper levels), columns
= ranks. Each drafter class declares its own (``Drafter.sizing_prior``); a measured profile
(``profile-<drafter>.json``) replaces it."""

RANK_PRIOR: Prior = ((0.45, 0.12, 0.06, 0.04, 0.03, 0.02, 0.02, 0.01),)
"""Token Recycling's candidates before any calibration (ranks 0..7): the paper's adjacency
table hits the target's next token with rank 0 about half the time, and the lower ranks fall
off quickly. EAGLE uses it too until a trained head's profile is measured."""

COPY_CHAIN_PRIOR: Prior = ((0.5,), (0.6,), (0.7,), (0.75,), (0.8,))
"""Chains copied from the context (prompt lookup, SAM's matches): one rank; the conditional
acceptance rises with depth because a copied span that matched so far tends to keep matching
(HF prompt lookup on SmolLM2 summarization: 2.5 tokens per step with 10-token chains, FACTS.md)."""

MODEL_CHAIN_PRIOR: Prior = ((0.6,), (0.65,), (0.7,))
"""Model-drafted chains (draft_model, self, t2d): a draft model that shares the target's
tokenizer agrees with it on roughly 60-80 % of next tokens (Leviathan et al. 2023: alpha
0.5-0.8 for T5/LaMDA pairs), and agreement rises a little along a chain that has matched so far.
A cautious prior."""


@dataclass(frozen=True)
class AcceptanceProfile:
    """``rank_accept[d - 1][r]``: probability that the rank-``r`` child of an accepted node at
    depth ``d - 1`` (the root is depth 0) is the target's next token. Depths past the last
    row use the last row; ranks past a row's end have probability 0."""

    rank_accept: tuple[tuple[float, ...], ...]
    name: str = "profile"
    proposal_rate: float = 1.0
    """Share of steps at which the drafter proposes a non-empty draft (``m`` in the rate)."""

    def __post_init__(self) -> None:
        if not self.rank_accept or not all(self.rank_accept):
            raise TreeSizingError(
                f"acceptance profile {self.name}: {self.rank_accept!r}; give at least one depth with one rank"
            )
        if not 0.0 <= self.proposal_rate <= 1.0:
            raise TreeSizingError(
                f"acceptance profile {self.name}: proposal_rate={self.proposal_rate}; expected 0 <= rate <= 1"
            )
        for d, row in enumerate(self.rank_accept, start=1):
            for r, p in enumerate(row):
                if not 0.0 <= p <= 1.0:
                    raise TreeSizingError(
                        f"acceptance profile {self.name}: depth {d} rank {r} has p={p}; expected 0 <= p <= 1"
                    )

    def p(self, depth: int, rank: int) -> float:
        row = self.rank_accept[min(depth, len(self.rank_accept)) - 1]
        return float(row[rank]) if rank < len(row) else 0.0

    @property
    def max_rank(self) -> int:
        return max(len(row) for row in self.rank_accept)

    def truncated(self, max_rank: int) -> AcceptanceProfile:
        """The same profile with at most ``max_rank`` candidates per node (1: a chain)."""
        return AcceptanceProfile(tuple(row[:max_rank] for row in self.rank_accept), self.name, self.proposal_rate)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "proposal_rate": self.proposal_rate,
                "rank_accept": [list(r) for r in self.rank_accept]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceProfile:
        # Files written before the proposal rate existed hold drafters that always propose.
        return cls(rank_accept=tuple(tuple(float(p) for p in row) for row in data["rank_accept"]),
                   name=str(data.get("name", "profile")), proposal_rate=float(data.get("proposal_rate", 1.0)))


def sibling_ranks(tree: DraftTree) -> list[int]:
    """Rank of every node among its siblings, in listing order (drafters list a parent's
    candidates best first: Token Recycling's templates and EAGLE's top-k expansion)."""
    seen: dict[int, int] = {}
    out = []
    for p in tree.parents:
        out.append(seen.get(p, 0))
        seen[p] = seen.get(p, 0) + 1
    return out



@dataclass(frozen=True)
class TreeChoice:
    """The chosen tree and why.

    Attributes:
        template: the tree's shape (0 nodes = no speculation).
        expected_tokens: tokens committed per step (accepted + the bonus token).
        step_s: draft + verification seconds per step.
        candidates: ``(nodes, max_depth, tokens_per_s)`` of every tree compared.
    """

    template: TreeTemplate
    expected_tokens: float
    step_s: float
    candidates: tuple[tuple[int, int, float], ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.expected_tokens / self.step_s

    @property
    def nodes(self) -> int:
        return len(self.template)

    def describe(self) -> str:
        t = self.template
        shape = "no speculation" if not len(t) else f"{len(t)} nodes, depth {t.max_depth}, levels {t.level_sizes()}"
        return f"{shape}: {self.expected_tokens:.2f} tokens/step, {self.tokens_per_s:.1f} tokens/s expected"


def best_tree(profile: AcceptanceProfile, num_nodes: int, max_depth: int) -> tuple[TreeTemplate, float]:
    """The ``num_nodes``-node tree of depth <= ``max_depth`` with the most expected accepted
    tokens under ``profile`` (greedy best-first on path probability, optimal because a
    child's value never exceeds its parent's; Sequoia, section 3.1).

    Returns:
        ``(template, expected_accepted)`` (the bonus token not counted).
    """
    parents: list[int] = []
    ranks: list[int] = []
    value: list[float] = []
    heap: list[tuple[float, int, int, int, int]] = [(-profile.p(1, 0), 0, -1, 0, 1)]
    tie = 1
    while heap and len(parents) < num_nodes:
        neg_v, _, p, r, d = heapq.heappop(heap)
        if -neg_v <= 0.0:
            break  # nothing left that could be accepted
        idx = len(parents)
        parents.append(p)
        ranks.append(r)
        value.append(-neg_v)
        pv = 1.0 if p < 0 else value[p]
        if r + 1 < profile.max_rank:
            heapq.heappush(heap, (-(pv * profile.p(d, r + 1)), tie, p, r + 1, d))
            tie += 1
        if d < max_depth:
            heapq.heappush(heap, (-(value[idx] * profile.p(d + 1, 0)), tie, idx, 0, d + 1))
            tie += 1
    return TreeTemplate(parents=tuple(parents), ranks=tuple(ranks), name=f"auto_{len(parents)}_d{max_depth}"), math.fsum(value)


def choose_tree(
    latency: LatencyTable | Mapping[int, float],
    profile: AcceptanceProfile,
    *,
    sizes: Iterable[int] | None = None,
    max_depth: int = 8,
    draft_s: Callable[[TreeTemplate], float] | float = 0.0,
) -> TreeChoice:
    """The tree that maximises expected tokens per second (pure: no measurement here).

    Args:
        latency: verification seconds per node count (``0`` = plain decoding step).
        profile: acceptance by depth and rank.
        sizes: node counts compared (default: the latency table's sizes).
        max_depth: deepest level compared; every depth cap ``1..max_depth`` is tried per
            size, so plain chains (depth = size) and flat trees are both candidates.
        draft_s: seconds to draft a tree, a function of its template (EAGLE pays per
            level: ``level_s * template.max_depth``) or a constant charged to every
            non-empty tree.

    Ties go to the smaller tree. A step without a proposal (share ``1 - m``,
    ``profile.proposal_rate = m``) costs a plain step and commits one token. No speculation
    is chosen unless the best tree is expected to be :data:`SPECULATION_MARGIN` faster than
    plain decoding.
    """
    table = latency if isinstance(latency, LatencyTable) else LatencyTable(seconds=dict(latency))
    cost = draft_s if callable(draft_s) else (lambda t, c=float(draft_s): c if len(t) else 0.0)
    plain = table.at(0)
    m = profile.proposal_rate
    best = TreeChoice(TreeTemplate(parents=(), ranks=(), name="none"), 1.0, plain)
    cands: list[tuple[int, int, float]] = [(0, 0, best.tokens_per_s)]
    for n in sorted(set(sizes if sizes is not None else table.sizes) - {0}):
        for d in range(1, max_depth + 1):
            tmpl, acc = best_tree(profile, n, d)
            if len(tmpl) < n:
                continue  # profile cannot fill n nodes under this depth: a smaller size covers it
            choice = TreeChoice(tmpl, 1.0 + m * acc, m * (cost(tmpl) + table.at(n)) + (1.0 - m) * plain)
            cands.append((n, d, choice.tokens_per_s))
            if choice.tokens_per_s > best.tokens_per_s * (1 + 1e-12):
                best = choice
    if len(best.template) and best.tokens_per_s < cands[0][2] * (1 + SPECULATION_MARGIN):
        best = TreeChoice(TreeTemplate(parents=(), ranks=(), name="none"), 1.0, plain)
    return TreeChoice(best.template, best.expected_tokens, best.step_s, tuple(cands))
