"""The drafter contract: propose a tree of candidates, learn from what the target verified.

A drafter is as easy to add as transformers' ``CandidateGenerator``: subclass
:class:`Drafter`, implement :meth:`Drafter.propose` (and, when it learns online,
:meth:`Drafter.update`), and register it in :mod:`tss_opt.decoding.drafters.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from tss_opt.decoding.tree import DraftTree


@dataclass(frozen=True)
class VerifyFeedback:
    """What one verification step saw; handed to :meth:`Drafter.update` after every step.

    Attributes:
        tree: the tree that was verified.
        accepted: indices (into ``tree``) of the accepted nodes, root to leaf.
        committed: ``torch.LongTensor`` of shape ``(a + 1,)``: accepted tokens plus the
            target's bonus/correction token, in order.
        logits: ``torch.FloatTensor`` of shape ``(n + 1, vocab)``: target logits at
            ``[root, node_0, ..., node_{n-1}]`` (row ``i`` predicts the child of that node).
        hidden: ``torch.FloatTensor`` of shape ``(n + 1, hidden)``: the target's final hidden
            states (after the final norm) at the same rows, for feature-level drafters (EAGLE).
        root_token: the token at the root (the last committed token before this step).
    """

    tree: DraftTree
    accepted: tuple[int, ...]
    committed: torch.Tensor
    logits: torch.Tensor
    hidden: torch.Tensor
    root_token: int


class Drafter(ABC):
    """Proposes candidate tokens for the current context.

    The engine calls :meth:`reset` once per request, then alternates :meth:`propose` and
    :meth:`update`. Drafters never change the target's weights or its skip set.
    """

    #: Set by drafters that need the target's hidden states of the prompt (EAGLE).
    needs_prefill_feedback: bool = False
    #: Set by drafters whose trees carry ``DraftTree.confidence`` (per-node confidences);
    #: confidence routing (``drafter=routed``) accepts only such members.
    gives_confidence: bool = False
    #: Set by drafters that can attach their distribution to every node (``DraftTree.probs``)
    #: when their ``return_probs`` attribute is True: relaxed verification needs it.
    gives_distribution: bool = False

    def reset(self, prompt_ids: torch.Tensor) -> None:
        """Start a new request.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(prompt_len,)``.
        """

    @abstractmethod
    def propose(self, context: torch.Tensor) -> DraftTree:
        """Propose candidates that continue ``context``.

        Args:
            context: ``torch.LongTensor`` of shape ``(seq,)``: prompt plus every committed
                token; its last token is the root of the returned tree.

        Returns:
            A :class:`DraftTree` (possibly empty). With temperature > 0 only chains are
            verified by speculative sampling; ``probs`` must then be set for stochastic drafters.
        """

    def propose_within(self, context: torch.Tensor, max_depth: int) -> DraftTree:
        """:meth:`propose`, with no node deeper than ``max_depth`` (the engine's remaining
        context and token budget, :mod:`tss_opt.decoding.budget`).

        The default prunes the full proposal; a drafter that pays per drafted level (a draft
        model's forwards) or that maps feedback back to its own trees (TAPS) overrides it.
        """
        from tss_opt.decoding.budget import prune_depth

        return prune_depth(self.propose(context), max_depth)

    def update(self, feedback: VerifyFeedback) -> None:
        """Learn from a verification step (default: nothing to learn)."""

    def prefill_feedback(self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Called once after the target's prefill.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(prompt_len,)``.
            logits: ``torch.FloatTensor`` of shape ``(1, vocab)``: the target's logits at the
                last prompt position only (projecting every prompt position costs too much).
            hidden: ``torch.FloatTensor`` of shape ``(prompt_len, hidden)``.
        """
