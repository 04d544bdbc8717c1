"""Drafts within budget: no draft node past the context or the tokens left to generate.

A node at depth ``k`` below the root (the last committed token, at position ``prefix_len``)
is verified at position ``prefix_len + k``, and accepting a path of ``k`` nodes commits
``k + 1`` tokens (the target's own token included). So a step may draft at most

    min(max_new_tokens - n_out - 1, max_context - 1 - prefix_len)

levels: deeper nodes would either be cut from the output anyway or run the target at
positions it does not support (a 256-token prompt with ``max_context`` 265 reached
position 272 with pld(10)). Draft slots share positions by depth, so the cap is on depth; a
tree loses its nodes below the cap, its shallower nodes (their ancestors included) stay.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tss_opt.decoding.tree import ROOT, DraftTree

__all__ = ["draft_depth_limit", "prune_depth"]


def draft_depth_limit(prefix_len: int, tokens_left: int, max_context: int) -> int:
    """The deepest draft level a step may verify (0: no draft, only the target's token).

    Args:
        prefix_len: Cached tokens; the root sits at position ``prefix_len``.
        tokens_left: Tokens still to generate (``max_new_tokens - n_out``), at least 1.
        max_context: Positions the target supports (``0 .. max_context - 1``).
    """
    return max(0, min(tokens_left - 1, max_context - 1 - prefix_len))


def prune_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """``tree`` without its nodes deeper than ``max_depth``, in the same order (parents
    before children, links renumbered); ``probs`` and ``confidence`` rows follow their nodes.
    Returns ``tree`` itself when nothing is that deep."""
    depth = tree.depth
    if not depth or max(depth) <= max_depth:
        return tree
    keep = [i for i, d in enumerate(depth) if d <= max_depth]
    new_index = {old: new for new, old in enumerate(keep)}
    # A kept node's parent is shallower, hence kept: the links stay inside the pruned tree.
    parents = tuple(ROOT if tree.parents[i] == ROOT else new_index[tree.parents[i]] for i in keep)

    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[torch.tensor(keep, dtype=torch.long, device=t.device)]

    return replace(
        tree, tokens=rows(tree.tokens), parents=parents, probs=rows(tree.probs), confidence=rows(tree.confidence)
    )
