"""The drafter contract: propose a tree of candidates, learn from what the target verified.

A drafter is as easy to add as transformers' ``CandidateGenerator``: subclass
:class:`Drafter`, implement :meth:`Drafter.propose` (and, when it learns online,
:meth:`Drafter.update`), declare what it can do in ``capabilities``
(:class:`DrafterCapabilities`) and write its builder and ``conf/drafter/<name>.yaml``
(docs/drafters.md, "Adding a drafter").
Everyone who needs to know what a drafter can do (relaxed verification, the replay
evaluator, the engine, TAPS routing) reads ``capabilities``; nothing keeps a list of names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from tss_opt.decoding.sizing.choice import RANK_PRIOR, Prior
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.sizing.choice import TreeChoice
    from tss_opt.decoding.sizing.context import ContextSized


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


@dataclass(frozen=True)
class DrafterCapabilities:
    """What a drafter can do, declared once on its class (``capabilities = ...``) or, when
    it depends on its parts (SAMD's fallback, TAPS members), set on the instance.

    Attributes:
        distribution: can attach its distribution to every node (``DraftTree.probs``) when
            its ``return_probs`` attribute is True: relaxed verification needs it.
        confidence: its trees carry ``DraftTree.confidence`` (per-node confidences); TAPS
            confidence routing accepts only such members.
        prefill_feedback: needs the target's hidden states of the prompt (EAGLE).
        replayable: its proposals depend only on the context and on target features of
            committed tokens, so ``evaluator=replay`` reproduces the engine exactly.
        replay_refusal: why ``evaluator=replay`` cannot reproduce it and what to do instead
            (the error message; empty: a generic one).
    """

    distribution: bool = False
    confidence: bool = False
    prefill_feedback: bool = False
    replayable: bool = False
    replay_refusal: str = ""


class Drafter(ABC):
    """Proposes candidate tokens for the current context.

    The engine calls :meth:`reset` once per request, then alternates :meth:`propose` and
    :meth:`update`. Drafters never change the target's weights or its skip set.
    """

    #: What this drafter can do (:class:`DrafterCapabilities`); subclasses override it.
    capabilities: DrafterCapabilities = DrafterCapabilities()

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

    # ------------------------------------------------------------------------- sizing
    #: The acceptance by (depth, rank) the sizer assumes until a profile of this drafter is
    #: measured (:mod:`tss_opt.decoding.sizing`); each drafter class declares its own.
    sizing_prior: ClassVar[Prior] = RANK_PRIOR
    #: Set when the drafter is sized to the hardware (a size setting ``auto``): its choice per
    #: context bucket, read at every :meth:`propose` (so the size is a function of the context
    #: length alone). ``None``: a fixed size.
    sizer: ContextSized | None = None

    @property
    def choice(self) -> TreeChoice | None:
        """The sized choice for the shortest context (``None``: a fixed size); ``sizer`` has all."""
        return None if self.sizer is None else self.sizer.first


class NoDrafter(Drafter):
    """Proposes nothing: every step commits exactly the target's next token (plain decoding)."""

    capabilities = DrafterCapabilities(replayable=True)

    def propose(self, context: torch.Tensor) -> DraftTree:
        return DraftTree.empty()
