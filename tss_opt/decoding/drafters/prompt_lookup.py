"""Prompt-lookup decoding (PLD): copy the continuation of an earlier n-gram match.

Saxena 2023, as in transformers' ``PromptLookupCandidateGenerator``: the last ``n`` tokens
(``n`` from ``max_ngram`` down to ``min_ngram``) are searched for in prompt and output; the
tokens after the most recent earlier match are proposed as a chain.

Confidence (for ``drafter=routed``) is a heuristic, as prompt lookup has no distribution:
every node of a chain found by an ``n``-token match gets ``n / (n + 1)`` (Laplace's rule of
succession: the matched tokens are ``n`` successes in a row), so 0.5 for a 1-gram and 0.75 for
a 3-gram match.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.budget import prune_depth
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities
from tss_opt.decoding.drafters.building import builds, fixed_size, need_target
from tss_opt.decoding.sizing import AUTO, COPY_CHAIN_PRIOR, ContextSized, OnlineChain, load_profile
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel


class PromptLookupDrafter(Drafter):
    """Model-free chain drafter.

    Args:
        num_tokens: tokens proposed per step (at most); ``0`` proposes nothing (what
            ``num_tokens=auto`` chooses where no chain pays on the hardware).
        max_ngram: longest suffix searched for.
        min_ngram: shortest suffix searched for.
        sizer: the chain length per context length, overriding ``num_tokens``
            (``num_tokens=auto``, :meth:`sized_to`; a verified node costs more after a long
            context); a function of the context alone, so proposals still depend on the
            context only.
    """

    # Confidence: a match-length heuristic (module docstring); proposals depend on the context only.
    capabilities = DrafterCapabilities(confidence=True, replayable=True)
    sizing_prior = COPY_CHAIN_PRIOR

    def __init__(self, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1,
                 sizer: ContextSized | None = None, online: OnlineChain | None = None) -> None:
        if num_tokens < 0 or not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"prompt lookup needs num_tokens >= 0 and 1 <= min_ngram <= max_ngram; got "
                f"num_tokens={num_tokens}, min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        self.num_tokens = num_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.sizer = sizer
        self.online = online

    def reset(self, prompt_ids: torch.Tensor) -> None:
        if self.online is not None:
            self.online.reset()

    def propose(self, context: torch.Tensor) -> DraftTree:
        if self.online is None:
            L = int(context.numel())
            return self._lookup(context, self.sizer(L) if self.sizer is not None else self.num_tokens)
        full = self._lookup(context, self.online.max_tokens)
        k = self.online.length(context, full.tokens)
        return prune_depth(full, k) if k else DraftTree.empty()

    def _lookup(self, context: torch.Tensor, num_tokens: int) -> DraftTree:
        """The chain of at most ``num_tokens`` after the latest match of the longest suffix."""
        L = int(context.numel())
        if not num_tokens:
            return DraftTree.empty()
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            suffix = context[L - n :]
            # windows: [L - n, n]; the last window is the suffix itself, so search before it.
            windows = context[: L - 1].unfold(0, n, 1)
            hits = (windows == suffix).all(dim=1).nonzero()
            if hits.numel() == 0:
                continue
            start = int(hits[-1]) + n  # most recent match: its continuation starts here
            cont = context[start : min(start + num_tokens, L)]
            if cont.numel() > 0:
                conf = torch.full((int(cont.numel()),), n / (n + 1), dtype=torch.float32)
                return DraftTree.chain(cont.clone(), confidence=conf)
        return DraftTree.empty()

    @classmethod
    def sized_to(
        cls, target: TargetModel, *, max_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1,
        profile: str = "pld", directory: str | Path | None = None,
    ) -> PromptLookupDrafter:
        """``num_tokens=auto``: per context bucket, the chain length ``0..max_tokens`` that
        maximises expected tokens per second on this hardware (the latency table for that
        cached length and the ``profile-<profile>.json`` acceptance, else :attr:`sizing_prior`).
        ``0`` (no length pays) proposes nothing; the drafter keeps its capabilities as a TAPS
        member."""
        accept = load_profile(profile, cls.sizing_prior, directory)
        sizer = ContextSized.chain(target, accept, max_tokens=max_tokens, directory=directory)
        return cls(num_tokens=sizer.first.nodes, max_ngram=max_ngram, min_ngram=min_ngram, sizer=sizer)

    @classmethod
    def adapted_to(
        cls, target: TargetModel, *, max_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1,
        profile: str = "pld", directory: str | Path | None = None,
    ) -> PromptLookupDrafter:
        """``num_tokens=auto`` with ``adapt: true``: at every step, the chain length
        ``0..max_tokens`` that maximises expected tokens per second given the acceptance this
        request has shown so far (:class:`~tss_opt.decoding.sizing.online.OnlineChain`; its
        prior is the ``profile-<profile>.json`` acceptance, else :attr:`sizing_prior`) and the
        latency table of the step's context."""
        accept = load_profile(profile, cls.sizing_prior, directory)
        online = OnlineChain.for_target(target, accept, max_tokens=max_tokens, directory=directory)
        return cls(num_tokens=max_tokens, max_ngram=max_ngram, min_ngram=min_ngram, online=online)


@builds(PromptLookupDrafter)
def build_pld(
    target: TargetModel, loaded: LoadedModel, *, num_tokens: int | str, max_ngram: int, min_ngram: int, max_tokens: int,
    adapt: bool = True,
) -> Drafter:
    """Prompt lookup (model-free chain) of ``num_tokens`` (conf/drafter/pld.yaml: 10, the
    paper's setting). ``num_tokens="auto"`` sizes the chain per context length,
    ``0..max_tokens`` (:meth:`PromptLookupDrafter.sized_to`); with ``adapt=True`` the length is
    chosen at every step from the request's own acceptance (:meth:`PromptLookupDrafter.adapted_to`).
    ``adapt`` is read only with ``num_tokens="auto"``: a fixed chain stays fixed.

    Why pld stays fixed by default while the other drafters are sized: pld is the search's
    default drafter, and a search measures skip sets under one fixed decoding protocol. A
    hardware-chosen chain would differ between the hosts of one shared study, and on a CPU in
    float32 it often chooses no speculation at all, which leaves every set with accepted
    length 1. The server serves with ``num_tokens=auto``."""
    if not isinstance(adapt, bool):
        raise DrafterConfigError(f"drafter 'pld': adapt={adapt!r}; expected true or false (docs/drafters.md, 'Adapted per request')")
    if num_tokens == AUTO:
        need_target("pld", "num_tokens", target)
        build = PromptLookupDrafter.adapted_to if adapt else PromptLookupDrafter.sized_to
        return build(target, max_tokens=fixed_size("pld", "max_tokens", max_tokens), max_ngram=max_ngram,
                     min_ngram=min_ngram)
    return PromptLookupDrafter(num_tokens=fixed_size("pld", "num_tokens", num_tokens), max_ngram=max_ngram,
                               min_ngram=min_ngram)
