"""Drafts sized per context: one tree choice per cached length, for every drafter that sizes.

Verification costs depend on the context the tree attends to: one verified
node cost 2-5 % of a plain step after 64 cached tokens and about 25 % after 800 (float32, one
thread), so a tree sized after 64 tokens drafted too much on a long prompt and lost to plain
decoding (Token Recycling 0.94x); how much a node costs is the machine's, read from its tables
(docs/engine.md). :class:`ContextSized` makes one
:func:`~tss_opt.decoding.sizing.choice.choose_tree` choice per :data:`CONTEXT_BUCKETS` entry
from the latency table measured on that many cached tokens, all when the drafter is built
(decoding never stops to measure), so the size is a function of the context length alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tss_opt.decoding.sizing.choice import AcceptanceProfile, TreeChoice, choose_tree
from tss_opt.decoding.sizing.latency import DEFAULT_SIZES, load_or_measure_latency
from tss_opt.decoding.templates import TreeTemplate

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = ["CONTEXT_BUCKETS", "ContextSized", "context_bucket", "fitting_buckets", "sized_chain", "sized_tree"]

CONTEXT_BUCKETS = (64, 256, 1024)
"""Cached lengths (tokens) a drafter is sized for; a step uses the smallest bucket that holds
its context (the largest beyond it): the costlier table, so a step never drafts more than its
context pays for."""

DraftSeconds = Callable[[TreeTemplate], float] | float


def fitting_buckets(target: TargetModel, buckets: tuple[int, ...] = CONTEXT_BUCKETS) -> list[int]:
    """The buckets whose latency tables fit the target's context (a table's forwards verify
    up to ``max(DEFAULT_SIZES)`` nodes after that many cached tokens); the smallest if none."""
    room = int(target.max_context) - max(DEFAULT_SIZES) - 1
    return [b for b in buckets if b <= room] or [min(buckets)]


def context_bucket(buckets: Iterable[int], context_len: int) -> int:
    """The bucket a step drafting from ``context_len`` tokens uses: the smallest that holds it,
    else the largest (the costlier table, so a step never drafts more than its context pays for)."""
    sizes = list(buckets)
    fits = [b for b in sizes if b >= context_len]
    return min(fits) if fits else max(sizes)


def sized_tree(
    target: TargetModel,
    profile: AcceptanceProfile,
    *,
    prefix_len: int = 64,
    max_depth: int = 8,
    max_nodes: int | None = None,
    draft_s: DraftSeconds = 0.0,
    directory: str | Path | None = None,
) -> TreeChoice:
    """The tree (any shape up to ``max_depth`` levels and ``max_nodes`` nodes) that maximises
    expected tokens per second after ``prefix_len`` cached tokens: the cached (or freshly
    measured) latency table for that context and ``profile``. ``draft_s``: the drafting cost
    (seconds, constant or per template; EAGLE pays per level)."""
    table = load_or_measure_latency(target, directory, prefix_len=prefix_len)
    sizes = [n for n in table.sizes if max_nodes is None or n <= max_nodes]
    return choose_tree(table, profile, sizes=sizes, max_depth=max_depth, draft_s=draft_s)


def sized_chain(
    target: TargetModel,
    profile: AcceptanceProfile,
    *,
    prefix_len: int = 64,
    max_tokens: int = 10,
    token_s: float = 0.0,
    directory: str | Path | None = None,
) -> TreeChoice:
    """The chain length ``0..max_tokens`` that maximises expected tokens per second after
    ``prefix_len`` cached tokens (the profile's rank-0 column, the latency table interpolated at
    every length). ``0``: no chain pays, the drafter should not speculate. ``token_s``: seconds
    to draft each token (0 for prompt lookup and SAM; a draft-model forward for model chains)."""
    table = load_or_measure_latency(target, directory, prefix_len=prefix_len)
    return choose_tree(table, profile.truncated(1), sizes=range(1, max_tokens + 1), max_depth=max_tokens,
                       draft_s=lambda t: token_s * len(t))


class ContextSized:
    """One :class:`TreeChoice` per context bucket the target can hold.

    Args:
        target: the verifier (its ``max_context`` bounds the buckets: a latency table's
            forwards must fit).
        choose: the choice for a cached length, e.g.
            ``lambda n: sized_chain(target, profile, prefix_len=n)``.
        buckets: the cached lengths to size for.

    ``at(context_len)`` is the choice for a step drafting from ``context_len`` tokens,
    ``nodes(context_len)`` its size (a chain's length), ``describe()`` lists them all.
    """

    def __init__(
        self, target: TargetModel, choose: Callable[[int], TreeChoice], buckets: tuple[int, ...] = CONTEXT_BUCKETS
    ) -> None:
        self.choices: dict[int, TreeChoice] = {b: choose(b) for b in fitting_buckets(target, buckets)}

    @classmethod
    def chain(
        cls, target: TargetModel, profile: AcceptanceProfile, *, max_tokens: int, token_s: float = 0.0,
        directory: str | Path | None = None,
    ) -> ContextSized:
        """A chain drafter's sizes: :func:`sized_chain` per bucket."""
        return cls(target, lambda n: sized_chain(target, profile, prefix_len=n, max_tokens=max_tokens, token_s=token_s,
                                                 directory=directory))

    @classmethod
    def tree(
        cls, target: TargetModel, profile: AcceptanceProfile, *, max_depth: int = 8, max_nodes: int | None = None,
        draft_s: DraftSeconds = 0.0, directory: str | Path | None = None,
    ) -> ContextSized:
        """A tree drafter's sizes: :func:`sized_tree` per bucket."""
        return cls(target, lambda n: sized_tree(target, profile, prefix_len=n, max_depth=max_depth, max_nodes=max_nodes,
                                                draft_s=draft_s, directory=directory))

    def bucket(self, context_len: int) -> int:
        return context_bucket(self.choices, context_len)

    def at(self, context_len: int) -> TreeChoice:
        return self.choices[self.bucket(context_len)]

    def nodes(self, context_len: int) -> int:
        return self.at(context_len).nodes

    __call__ = nodes

    @property
    def first(self) -> TreeChoice:
        """The choice for the shortest context."""
        return self.choices[min(self.choices)]

    @property
    def never_speculates(self) -> bool:
        """No bucket pays for any draft: the drafter can be replaced by plain decoding."""
        return not any(c.nodes for c in self.choices.values())

    def describe(self) -> str:
        return "; ".join(f"context <= {b}: {c.describe()}" for b, c in sorted(self.choices.items()))
