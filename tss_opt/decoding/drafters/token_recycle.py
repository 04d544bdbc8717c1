"""Token Recycling: a static tree filled from the target's own recent top-k candidates.

Luo et al. 2024 (arXiv 2408.08696). Every verification already computes the target's logits
at the root and at every tree node; their top-k next tokens are "recycled" into an adjacency
table ``token -> k candidates``. The next draft expands a static template from the last
committed token: a node takes the rank-``r`` candidate of its parent's token. The table is
kept across requests by default, as in the paper (a warm table drafts better).

The table also keeps the target's probability of every candidate as last seen; a node's
confidence (``DraftTree.confidence``, for ``drafter=routed``) is that probability of its token
after its parent's token.

With ``template: auto`` and ``adapt: true`` (the default), a step drafts its context's sized
tree only where this request's own acceptance says drafting pays: the table's rank-0 chain
below the root is scored, drafted or not, against the tokens the target commits
(:class:`~tss_opt.decoding.sizing.online.OnlineChain`), and a step whose best chain length is 0
is a plain step. Why: one calibrated profile sized every request alike, and on long prompts a
request that accepted less than the calibration prompts ran at 0.91x plain decoding
(docs/results, round 10).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, VerifyFeedback
from tss_opt.decoding.drafters.building import builds, need_target
from tss_opt.decoding.sizing import AUTO, RANK_PRIOR, ContextSized, OnlineChain, load_profile
from tss_opt.decoding.templates import (
    TemplateError,
    TreeTemplate,
    load_template,
)
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel

DEFAULT_TEMPLATE = "builtin:token_recycle_15.json"


class AdjacencyTable:
    """For every token, the target's ``k`` most likely next tokens as last seen.

    Attributes:
        candidates: ``torch.LongTensor`` of shape ``(vocab, k)``, rank 0 first.
        probs: ``torch.FloatTensor`` of shape ``(vocab, k)``: the target's probability of
            each candidate when it was stored (the drafted nodes' confidences).
        filled: ``torch.BoolTensor`` of shape ``(vocab,)``: rows that hold real candidates.
    """

    def __init__(self, vocab_size: int, k: int) -> None:
        self.k = k
        self.candidates = torch.zeros(vocab_size, k, dtype=torch.long)
        self.probs = torch.zeros(vocab_size, k, dtype=torch.float32)
        self.filled = torch.zeros(vocab_size, dtype=torch.bool)

    @property
    def vocab_size(self) -> int:
        return int(self.candidates.shape[0])

    def store(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Record the top-k of ``logits[i]`` as the candidates after ``tokens[i]``.

        Args:
            tokens: ``torch.LongTensor`` of shape ``(m,)``: the input token of every row.
            logits: ``torch.FloatTensor`` of shape ``(m, vocab)``: the target's logits there.

        When a token occurs in several rows, its first row wins (the root, then shallower
        nodes), so updates are deterministic.
        """
        tokens = tokens.reshape(-1).cpu()
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(
                f"logits have {logits.shape[-1]} columns but the adjacency table was built for a vocabulary "
                f"of {self.vocab_size}; use one drafter per target vocabulary"
            )
        top_v, top_i = logits.topk(self.k, dim=-1)  # [m, k]
        top = top_i.cpu()
        # p = exp(logit - logsumexp): only the k kept columns are exponentiated.
        lse = torch.logsumexp(logits.float(), dim=-1, keepdim=True)
        top_p = (top_v.float() - lse).exp().cpu()
        uniq, inverse = torch.unique(tokens, return_inverse=True)
        rows = torch.arange(tokens.numel())
        first = torch.full((uniq.numel(),), tokens.numel(), dtype=torch.long).scatter_reduce(
            0, inverse, rows, reduce="amin"
        )
        self.candidates[uniq] = top[first]
        self.probs[uniq] = top_p[first]
        self.filled[uniq] = True

    def chain(self, token: int, length: int) -> list[int]:
        """The rank-0 candidate of ``token``, that token's rank-0 candidate, and so on: at most
        ``length`` token ids, fewer where a token has no row yet (none: ``token`` has none).

        Walked through NumPy views of the host tensors (written in place, so the views stay
        current): a lookup per token, no tensor read (a chain of 8 on SmolLM2's table, one
        thread: 5 us, against 36 us through ``int()`` and ``bool()`` of tensor elements and
        111 us through tensor ops read back once; ``/tmp`` script, 2026-12-07)."""
        cand, filled = self.candidates.numpy(), self.filled.numpy()
        out: list[int] = []
        while len(out) < length and 0 <= token < len(filled) and filled[token]:
            token = int(cand[token, 0])
            out.append(token)
        return out


class TokenRecycleDrafter(Drafter):
    """Expands a static template from an adjacency table learned from verification logits.

    Args:
        template: a :class:`TreeTemplate`, a mapping, a JSON path, or ``"builtin:<name>.json"``.
        top_k: candidates kept per token; every template rank must be below it.
        keep_table: keep the table across requests (the paper's "hot start"); ``False``
            clears it in :meth:`reset` so every request starts cold.
        max_nodes: node budget for the template (``None``: no limit).
        sizer: the template per context length, overriding ``template`` (``template=auto``,
            :meth:`sized_to`).
        online: the per-request gate (``adapt: true``, :meth:`sized_to`): a step drafts only
            where the request's rank-0 acceptance so far makes a chain pay
            (:meth:`OnlineChain.length` > 0).
    """

    # The prefill's logits give the last prompt token's row; confidence: the stored probability
    # of each candidate. Not replayable: the table learns from target logits at rejected nodes.
    capabilities = DrafterCapabilities(
        prefill_feedback=True,
        confidence=True,
        replay_refusal=(
            "evaluator=replay cannot reproduce Token Recycling: its table learns from the target's logits at "
            "rejected draft-tree nodes, which a replay never computes; use evaluator=engine with this drafter"
        ),
    )
    sizing_prior = RANK_PRIOR

    def __init__(
        self,
        template: TreeTemplate | Mapping[str, Any] | str | Path = DEFAULT_TEMPLATE,
        top_k: int = 8,
        keep_table: bool = True,
        max_nodes: int | None = None,
        sizer: ContextSized | None = None,
        online: OnlineChain | None = None,
    ) -> None:
        if top_k < 1:
            raise ValueError(
                f"token recycling top_k={top_k}; expected a positive integer such as 8"
            )
        self.template = load_template(template, max_nodes=max_nodes)
        for i, r in enumerate(self.template.ranks):
            if r >= top_k:
                raise TemplateError(
                    f"{self.template.name}: node {i} takes rank {r} but the table keeps only top_k={top_k} "
                    f"candidates; raise top_k to at least {self.template.max_rank + 1}"
                )
        self.top_k = top_k
        self.keep_table = keep_table
        self.table: AdjacencyTable | None = None
        self.sizer = sizer
        self.online = online
        self._levels = self._plan_levels(self.template)
        # Planned levels per template: a sized drafter switches templates with the context.
        self._plans: dict[int, tuple[TreeTemplate, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]] = {}

    @staticmethod
    def _plan_levels(t: TreeTemplate) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per depth: (node indices, parent indices, ranks), each ``torch.LongTensor``."""
        depths = t.depths
        levels = []
        for d in range(1, t.max_depth + 1):
            idx = [i for i, di in enumerate(depths) if di == d]
            levels.append(
                (
                    torch.tensor(idx, dtype=torch.long),
                    torch.tensor([t.parents[i] for i in idx], dtype=torch.long),
                    torch.tensor([t.ranks[i] for i in idx], dtype=torch.long),
                )
            )
        return levels

    # ------------------------------------------------------------------------- learning
    def _ensure_table(self, vocab_size: int) -> AdjacencyTable:
        if self.table is None or self.table.vocab_size != vocab_size:
            self.table = AdjacencyTable(vocab_size, self.top_k)
        return self.table

    def reset(self, prompt_ids: torch.Tensor) -> None:
        if not self.keep_table:
            self.table = None
        if self.online is not None:
            self.online.reset()

    def prefill_feedback(
        self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        table = self._ensure_table(int(logits.shape[-1]))
        table.store(prompt_ids.reshape(-1)[-1:], logits[-1:])

    def update(self, feedback: VerifyFeedback) -> None:
        # Row 0 is the root, row i + 1 is node i: every row's input token is known.
        table = self._ensure_table(int(feedback.logits.shape[-1]))
        tokens = torch.cat(
            [torch.tensor([feedback.root_token], dtype=torch.long), feedback.tree.tokens.cpu()]
        )
        table.store(tokens, feedback.logits)

    # ------------------------------------------------------------------------- drafting
    def expand(self, root_token: int) -> DraftTree:
        """Fill the template below ``root_token``; nodes whose parent token has no table row
        are dropped with their whole subtree."""
        table = self.table
        n = len(self.template)
        if (
            table is None
            or n == 0
            or not 0 <= root_token < table.vocab_size
            or not bool(table.filled[root_token])
        ):
            return DraftTree.empty()
        tok = torch.zeros(n, dtype=torch.long)
        conf = torch.zeros(n, dtype=torch.float32)
        valid = torch.zeros(n, dtype=torch.bool)
        for depth, (idx, par, rank) in enumerate(self._levels, start=1):
            if depth == 1:
                ptok = torch.full_like(idx, root_token)
                pvalid = torch.ones_like(idx, dtype=torch.bool)
            else:
                ptok, pvalid = tok[par], valid[par]
            tok[idx] = table.candidates[ptok, rank]
            conf[idx] = table.probs[ptok, rank]
            valid[idx] = pvalid & table.filled[ptok]
        if not bool(valid.any()):
            return DraftTree.empty()
        # Renumber the surviving nodes; a dropped node's subtree is dropped too, so every
        # kept node's parent is kept.
        new_index = torch.cumsum(valid.long(), 0) - 1
        keep = valid.nonzero().reshape(-1)
        parents = torch.tensor(self.template.parents, dtype=torch.long)[keep]
        new_parents = torch.where(parents < 0, parents, new_index[parents.clamp_min(0)])
        return DraftTree(
            tokens=tok[keep], parents=tuple(new_parents.tolist()), confidence=conf[keep]
        )

    def rank0_chain(self, root_token: int, length: int) -> list[int]:
        """The table's most likely continuation of ``root_token`` (:meth:`AdjacencyTable.chain`;
        none before the table exists)."""
        return [] if self.table is None else self.table.chain(root_token, length)

    def propose(self, context: torch.Tensor) -> DraftTree:
        if self.sizer is not None:
            self._use(self.sizer.bucket(int(context.numel())))
        root = int(context[-1])
        # The gate scores the rank-0 chain at every step that has a template, drafted or not.
        if self.online is not None and len(self.template):
            if not self.online.length(context, self.rank0_chain(root, self.online.max_tokens)):
                return DraftTree.empty()
        return self.expand(root)

    def _use(self, bucket: int) -> None:
        """Switch to the sized template of a context bucket (levels planned once per bucket)."""
        if bucket not in self._plans:
            assert self.sizer is not None
            template = self.sizer.choices[bucket].template
            self._plans[bucket] = (template, self._plan_levels(template))
        self.template, self._levels = self._plans[bucket]

    @classmethod
    def sized_to(
        cls,
        target: TargetModel,
        top_k: int = 8,
        keep_table: bool = True,
        max_nodes: int | None = None,
        max_depth: int = 8,
        directory: str | Path | None = None,
        adapt: bool = False,
    ) -> TokenRecycleDrafter:
        """``template=auto``: per context bucket, the template that maximises expected tokens
        per second on this hardware (:mod:`tss_opt.decoding.sizing`: the latency table for
        that cached length and the ``token_recycle`` acceptance profile, else
        :attr:`sizing_prior`). An empty template means that no tree pays there: those steps
        are plain decoding steps. ``adapt``: gate every step on the request's own acceptance
        (:class:`OnlineChain` over the rank-0 chain, the profile's rank-0 column as its prior,
        chains up to ``max_depth``)."""
        accept = load_profile("token_recycle", cls.sizing_prior, directory).truncated(top_k)
        sizer = ContextSized.tree(target, accept, max_depth=max_depth, max_nodes=max_nodes, directory=directory)
        online = OnlineChain.for_target(target, accept, max_tokens=max_depth, directory=directory) if adapt else None
        return cls(template=sizer.first.template, top_k=top_k, keep_table=keep_table, sizer=sizer, online=online)


@builds(TokenRecycleDrafter)
def build_token_recycle(
    target: TargetModel, loaded: LoadedModel, *, template: Any, top_k: int, keep_table: bool, max_nodes: int | None,
    adapt: bool = True,
) -> Drafter:
    """Token Recycling; ``template=auto`` (the default) sizes the tree per context length, a
    template (``builtin:token_recycle_15.json``, a JSON path, a mapping) fixes it.
    ``adapt=True`` (the default, read only with ``template=auto``; kept out of the shipped file
    so stored studies keep their metadata) drafts only at steps where the request's own
    acceptance pays (:meth:`TokenRecycleDrafter.sized_to`)."""
    if not isinstance(adapt, bool):
        raise DrafterConfigError(
            f"drafter 'token_recycle': adapt={adapt!r}; expected true or false (docs/drafters.md, 'Adapted per request')"
        )
    if template == AUTO:
        need_target("token_recycle", "template", target)
        return TokenRecycleDrafter.sized_to(target, top_k=top_k, keep_table=keep_table, max_nodes=max_nodes, adapt=adapt)
    return TokenRecycleDrafter(template=template, top_k=top_k, keep_table=keep_table, max_nodes=max_nodes)
