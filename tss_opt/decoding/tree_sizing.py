"""Draft trees sized to the hardware (Sequoia's idea, Chen et al. 2024, arXiv 2402.12374).

Three parts, one per stage:

1. :class:`LatencyTable`: the latency of one verification forward against the number of tree
   nodes, measured once per (machine, model, dtype, device) on a warm cache and cached as JSON
   (``storage/tree_sizing/latency-<key>.json``) with the measurement's date and its key.
2. :class:`AcceptanceProfile`: per drafter, the probability that the rank-``r`` candidate
   below an accepted node at depth ``d - 1`` is the target's next token (depth ``d``, rank
   ``r``); measured from calibration prompts by :func:`measure_acceptance` (the engine's own
   verification logits), or a prior.
3. :func:`choose_tree`, a pure function: the tree (size, depth, branching; a plain chain; or
   no speculation at all) maximising expected tokens per second::

       rate(T) = (1 + m * sum_{v in T} prod_{u on path(v)} p(depth(u), rank(u)))
                 / (m * (draft_s(T) + latency(|T|)) + (1 - m) * latency(0))

   The ``1`` is the target's bonus/correction token, committed by every step; ``latency(0)``
   is a plain decoding step, so the empty tree is "no speculation" and wins when verifying
   any tree costs more than it returns (this 2-core CPU), while a wide tree wins where
   verifying 64 nodes costs about one token (a GPU). ``m`` is the profile's proposal rate:
   the share of steps at which the drafter proposes anything (1 for tree drafters; prompt
   lookup has nothing to propose when the context holds no match, and such a step costs a
   plain step and commits one token).

Settings (the defaults, conf/drafter/*.yaml): ``template: auto`` on ``token_recycle`` and
``samd``'s fallback (:func:`auto_template`), ``total_tokens: auto`` on ``eagle``
(:func:`sized_eagle`); TAPS members follow their own defaults. On request (their defaults
stay fixed): ``num_tokens: auto`` on ``pld`` (:class:`ContextSizedChain`: :func:`sized_chain`
per context length) and on the model-drafted
chains ``draft_model``, ``self`` and ``t2d`` (:func:`sized_model_chain`, which charges each
drafted token its measured draft forward). A fixed size stays available (an integer, or a
template name). The cache folder is :func:`sizing_dir` (``storage/tree_sizing`` or ``$TSS_TREE_SIZING_DIR``); the choice is a pure
function of the files there, so every build on a machine chooses the same tree.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.decoding.drafter import Drafter, VerifyFeedback
from tss_opt.decoding.drafters.templates import TreeTemplate
from tss_opt.decoding.tree import DraftTree
from tss_opt.decoding.tree_latency import (
    DEFAULT_DIR,
    DEFAULT_SIZES,
    ENV_DIR,
    LatencyTable,
    TreeSizingError,
    hardware_key,
    load_or_measure_draft_cost,
    load_or_measure_latency,
    measure_latency,
    sizing_dir,
)

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = [
    "AUTO", "CONTEXT_BUCKETS", "ContextSizedChain", "DEFAULT_DIR", "DEFAULT_SIZES", "ENV_DIR", "PRIORS", "PRIOR_RANK_ACCEPT", "AcceptanceCounter",
    "AcceptanceProfile", "LatencyTable", "ProfilingDrafter", "TreeChoice", "TreeSizingError", "auto_template",
    "best_tree", "chain_token_seconds", "choose_tree", "eagle_level_seconds", "hardware_key", "load_or_measure_draft_cost",
    "load_or_measure_latency", "load_profile", "measure_acceptance", "measure_latency", "save_profile",
    "sibling_ranks", "sized_chain", "sized_eagle", "sized_model_chain", "sizing_dir",
]

AUTO = "auto"
"""The template setting that asks for a hardware-sized tree."""
# A prior for Token Recycling's candidates before any calibration (ranks 0..7): the paper's
# adjacency table hits the target's next token with rank 0 about half the time, and the
# lower ranks fall off quickly. Used only when no measured profile is cached.
PRIOR_RANK_ACCEPT = (0.45, 0.12, 0.06, 0.04, 0.03, 0.02, 0.02, 0.01)
# Priors by drafter name (rows = depths 1, 2, ...; the last row holds for deeper levels), used
# until a measured ``profile-<drafter>.json`` exists. Chains (prompt lookup, SAMD's matches)
# have one rank; their conditional acceptance rises with depth because a copied span that
# matched so far tends to keep matching (HF prompt lookup on SmolLM2 summarization: 2.5
# tokens per step with 10-token chains, FACTS.md). EAGLE's prior is Token Recycling's until a
# trained head's profile is measured (measure_acceptance).
# Model-drafted chains (draft_model, self, t2d): a draft model that shares the target's
# tokenizer agrees with it on roughly 60-80% of next tokens (Leviathan et al. 2023: alpha 0.5-0.8
# for T5/LaMDA pairs), and agreement rises a little along a chain that has matched so far. A
# cautious prior: the measured profile (measure_acceptance) replaces it.
PRIOR_MODEL_CHAIN = ((0.6,), (0.65,), (0.7,))
PRIORS: dict[str, tuple[tuple[float, ...], ...]] = {
    "token_recycle": (PRIOR_RANK_ACCEPT,),
    "eagle": (PRIOR_RANK_ACCEPT,),
    "pld": ((0.5,), (0.6,), (0.7,), (0.75,), (0.8,)),
    "draft_model": PRIOR_MODEL_CHAIN,
    "self": PRIOR_MODEL_CHAIN,
    "t2d": PRIOR_MODEL_CHAIN,
}


# ------------------------------------------------------------------------------ acceptance
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
        for flag in ("needs_prefill_feedback", "gives_confidence", "gives_distribution"):
            setattr(self, flag, getattr(inner, flag, False))

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
    from tss_opt.decoding.engine import SpeculativeEngine

    counter = AcceptanceCounter(max_depth, max_rank)
    engine = SpeculativeEngine(target, ProfilingDrafter(drafter, counter))
    for prompt in prompts:
        engine.generate(prompt, max_new_tokens=max_new_tokens)
    return counter.profile(name=name)


# ------------------------------------------------------------------------------ the choice
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
    ``profile.proposal_rate = m``) costs a plain step and commits one token.
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
    return TreeChoice(best.template, best.expected_tokens, best.step_s, tuple(cands))


def load_profile(drafter: str, directory: str | Path | None = None) -> AcceptanceProfile:
    """The drafter's measured profile (``<dir>/profile-<drafter>.json``, ``<dir>`` as in
    :func:`sizing_dir`), else its prior (:data:`PRIORS`; Token Recycling's for other names)."""
    path = sizing_dir(directory) / f"profile-{drafter}.json"
    if path.is_file():
        return AcceptanceProfile.from_dict(json.loads(path.read_text(encoding="utf-8")))
    return AcceptanceProfile(rank_accept=PRIORS.get(drafter, (PRIOR_RANK_ACCEPT,)), name=f"prior:{drafter}")


def save_profile(profile: AcceptanceProfile, drafter: str, directory: str | Path | None = None) -> Path:
    path = sizing_dir(directory) / f"profile-{drafter}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path


def auto_template(
    target: TargetModel,
    drafter: str = "token_recycle",
    *,
    directory: str | Path | None = None,
    max_depth: int = 8,
    max_rank: int | None = None,
    max_nodes: int | None = None,
) -> TreeChoice:
    """``template=auto``: the cached (or freshly measured) latency table of this hardware and
    the drafter's profile, fed to :func:`choose_tree`. ``max_rank`` caps the ranks (Token
    Recycling keeps ``top_k`` candidates per token)."""
    table = load_or_measure_latency(target, directory)
    profile = load_profile(drafter, directory)
    if max_rank is not None:
        profile = profile.truncated(max_rank)
    sizes = [n for n in table.sizes if max_nodes is None or n <= max_nodes]
    return choose_tree(table, profile, sizes=sizes, max_depth=max_depth)


def eagle_level_seconds(target: TargetModel, drafter: Drafter, *, depth: int, new_tokens: int = 8) -> float:
    """Seconds per drafted level of an EAGLE-style drafter (one head forward and one
    ``lm_head`` projection per level): its draft time per step over a short greedy run on a
    fixed random prompt, divided by ``depth``."""
    stats = _short_run(target, drafter, new_tokens)
    return stats.draft_s / max(1, stats.steps) / depth


def _short_run(target: TargetModel, drafter: Drafter, new_tokens: int) -> Any:
    """The :class:`~tss_opt.decoding.stats.DecodeStats` of a short greedy run with ``drafter``
    on a fixed random 32-token prompt, after a 2-token warm-up (what draft costs are timed on)."""
    from tss_opt.decoding.engine import SpeculativeEngine

    vocab = int(target.model.config.vocab_size)
    prompt = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(0))
    engine = SpeculativeEngine(target, drafter)
    engine.generate(prompt, max_new_tokens=2)
    return engine.generate(prompt, max_new_tokens=new_tokens).stats


def sized_eagle(
    target: TargetModel,
    head: Any,
    *,
    depth: int = 6,
    top_k: int = 8,
    return_probs: bool = False,
    directory: str | Path | None = None,
) -> Drafter:
    """``drafter=eagle total_tokens=auto``: the EAGLE-2 budget (``total_tokens`` = nodes + 1,
    ``depth``) that maximises expected tokens per second, from the cached latency table, the
    ``eagle`` profile (``profile-eagle.json``, else the prior) and the head's measured cost
    per level; :class:`~tss_opt.decoding.engine.NoDrafter` when no tree pays."""
    from tss_opt.decoding.drafters.eagle import EagleDrafter
    from tss_opt.decoding.engine import NoDrafter

    table = load_or_measure_latency(target, directory)
    profile = load_profile("eagle", directory)
    profile = profile.truncated(top_k)
    # Cached per hardware key, so every build (engine, replay evaluator) chooses the same tree.
    level_s = load_or_measure_draft_cost(
        target, f"eagle_level_d{depth}_k{top_k}",
        lambda: eagle_level_seconds(target, EagleDrafter(head, total_tokens=60, depth=depth, top_k=top_k), depth=depth),
        directory,
    )
    choice = choose_tree(table, profile, max_depth=depth, draft_s=lambda t: level_s * t.max_depth)
    if not choice.nodes:
        drafter: Drafter = NoDrafter()
    else:
        drafter = EagleDrafter(
            head, total_tokens=choice.nodes + 1, depth=choice.template.max_depth, top_k=top_k,
            return_probs=return_probs,
        )
    drafter.choice = choice  # type: ignore[attr-defined]
    return drafter


def sized_chain(
    target: TargetModel,
    drafter: str = "pld",
    *,
    max_tokens: int = 10,
    directory: str | Path | None = None,
    token_s: float = 0.0,
    prefix_len: int = 64,
) -> TreeChoice:
    """``num_tokens=auto`` for chain drafters (prompt lookup): the chain length ``0..max_tokens``
    maximising expected tokens per second when the drafter has a proposal (the profile's rank-0
    column by depth and its proposal rate, the latency table interpolated at every length).
    ``0``: no chain pays on this hardware, so the drafter should not speculate. ``token_s``:
    seconds to draft each
    token (0 for prompt lookup; a draft-model forward for :func:`sized_model_chain`).
    ``prefix_len``: the context the latency table is measured on (:class:`ContextSizedChain`)."""
    table = load_or_measure_latency(target, directory, prefix_len=prefix_len)
    profile = load_profile(drafter, directory)
    return choose_tree(table, profile.truncated(1), sizes=range(1, max_tokens + 1), max_depth=max_tokens,
                       draft_s=lambda t: token_s * len(t))


CONTEXT_BUCKETS = (64, 256, 1024)
"""Contexts (tokens) a prompt-lookup chain is sized for; a request uses the smallest bucket
that holds its context (the largest beyond it). Costs grow with the context: on this CPU
(float32) one verified node costs 2-5 % of a plain step after 64 tokens and 25 % after 800."""


class ContextSizedChain:
    """``pld num_tokens=auto``: the chain length for the context a step drafts from.

    One :func:`sized_chain` choice per :data:`CONTEXT_BUCKETS` entry the target can hold,
    all made (and their latency tables measured and cached) when built, so decoding never
    stops to measure and the chain length is a function of the context alone (prompt
    lookup stays replayable). ``__call__(context_len)`` gives the length.
    """

    def __init__(self, target: TargetModel, drafter: str = "pld", *, max_tokens: int = 10,
                 directory: str | Path | None = None) -> None:
        room = int(target.max_context) - max(DEFAULT_SIZES) - 1  # a table's forwards must fit
        buckets = [b for b in CONTEXT_BUCKETS if b <= room] or [min(CONTEXT_BUCKETS)]
        self.choices: dict[int, TreeChoice] = {
            b: sized_chain(target, drafter, max_tokens=max_tokens, directory=directory, prefix_len=b) for b in buckets
        }

    def bucket(self, context_len: int) -> int:
        fits = [b for b in self.choices if b >= context_len]
        return min(fits) if fits else max(self.choices)

    def __call__(self, context_len: int) -> int:
        return self.choices[self.bucket(context_len)].nodes

    def describe(self) -> str:
        return "; ".join(f"context <= {b}: {c.describe()}" for b, c in sorted(self.choices.items()))


def chain_token_seconds(target: TargetModel, drafter: Drafter, *, new_tokens: int = 8) -> float:
    """Seconds per drafted token of a model-drafted chain (one draft-model forward each): its
    draft time over a short greedy run on a fixed random prompt, divided by the tokens it
    proposed."""
    stats = _short_run(target, drafter, new_tokens)
    return stats.draft_s / max(1, stats.draft_proposed)


def sized_model_chain(
    target: TargetModel,
    drafter: str,
    make: Callable[[int], Drafter],
    *,
    cost_name: str,
    max_tokens: int = 8,
    directory: str | Path | None = None,
) -> TreeChoice:
    """``num_tokens=auto`` for model-drafted chains (``draft_model``, ``self``, ``t2d``): the
    chain length ``0..max_tokens`` maximising expected tokens per second, where a chain of
    ``k`` costs ``k`` draft forwards plus the verification of ``k`` nodes.

    Args:
        drafter: the profile's name (``profile-<drafter>.json``, else :data:`PRIORS`).
        make: builds the drafter with a given chain length (used once, to measure the cost
            per drafted token, which is then cached as ``draft-<cost_name>-<key>.json``).
        cost_name: names the draft model in the cache (one file per draft model or skip set).
    """
    token_s = load_or_measure_draft_cost(
        target, cost_name, lambda: chain_token_seconds(target, make(max_tokens)), directory
    )
    return sized_chain(target, drafter, max_tokens=max_tokens, directory=directory, token_s=token_s)
