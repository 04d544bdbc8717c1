"""EAGLE drafting: the EAGLE-2 dynamic tree grown with an EAGLE-1 head.

Drafting follows EAGLE-2 (Li et al. 2024, arXiv 2406.16858): expand the ``top_k`` most
probable nodes of each level by cumulative log-probability, then keep the
``total_tokens - 1`` best nodes of all levels. The tree grows on the head's device: tokens,
parents, scores and ancestor masks stay there, and the candidates come back to the host once
per step, for the final selection (it used to upload ~54 small tensors and read
back ~16 per step).

The head (eagle_head.py) and its checkpoints (eagle_checkpoint.py) are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.cache import crop_to
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, NoDrafter, VerifyFeedback
from tss_opt.decoding.drafters.building import WeightCache, builds, fixed_size, need_target
from tss_opt.decoding.drafters.eagle_checkpoint import (
    CONFIG_FILE,
    TRAINING_FILE,
    WEIGHTS_BIN,
    WEIGHTS_SAFETENSORS,
    EagleHeadError,
    load_eagle_head,
    save_eagle_head,
    trained_for,
    warn_other_model,
)
from tss_opt.decoding.drafters.eagle_head import (
    EagleHead,
    additive_mask,
    frequent_tokens,
    random_eagle_head,
)
from tss_opt.decoding.host_syncs import upload
from tss_opt.decoding.sizing import (
    AUTO,
    RANK_PRIOR,
    ContextSized,
    load_or_measure_draft_cost,
    load_profile,
)
from tss_opt.decoding.sizing.measure import draft_seconds_per_level
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel

__all__ = [
    "CONFIG_FILE",
    "TRAINING_FILE",
    "WEIGHTS_BIN",
    "WEIGHTS_SAFETENSORS",
    "EagleDrafter",
    "EagleHead",
    "EagleHeadError",
    "additive_mask",
    "load_eagle_head",
    "frequent_tokens",
    "random_eagle_head",
    "save_eagle_head",
    "trained_for",
    "warn_other_model",
]


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax in at least float32 (half-precision scores would reorder close candidates)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def check_draft_vocab(head: Any, n: int | None) -> None:
    """Refuse a ``drafter.draft_vocab`` setting that ``head`` cannot serve (checked when the
    drafter is built, before any sizing, so the answer never depends on the machine).

    Raises:
        ValueError: ``n`` is negative, or positive for a head without a draft vocabulary.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"drafter.draft_vocab={n!r} is invalid; expected null (the head's), 0 (the whole vocabulary) or N > 0")
    if n and head.draft_vocab is None:
        raise ValueError(
            f"drafter.draft_vocab={n} but this EAGLE head carries no draft vocabulary (a checkpoint saved "
            "before heads had a draft vocabulary, or trained with train.draft_vocab=0); set drafter.draft_vocab=null, or retrain the head"
        )


class EagleDrafter(Drafter):
    """Drafts a dynamic tree with an EAGLE head fed the target's features.

    Args:
        head: an :class:`EagleHead` sharing the target's embeddings and ``lm_head``.
        total_tokens: tree budget counting the root, as EAGLE's ``total_token`` (60 gives
            59 draft nodes).
        depth: deepest draft level (EAGLE's ``depth`` + 1: EAGLE-2's depth 5 drafts 6 levels).
        top_k: children per expanded node and nodes expanded per level.
        return_probs: also attach each node's draft distribution (the head's softmax at its
            parent, ``DraftTree.probs`` with ``sampled=False``) for relaxed verification
            (``verification=diversed|cospec`` turns it on); exact verification ignores it.
        draft_vocab: how much of the head's draft vocabulary to draft from: ``None`` = all
            it carries (the whole vocabulary for a head without one), ``0`` = the whole
            vocabulary, ``N`` = its ``N`` most frequent tokens. Only ``lm_head``'s rows of
            those tokens are computed per tree level; a distribution (``return_probs``) is 0
            outside them, still a distribution over the whole vocabulary. Verification is the
            target's, so greedy decoding stays exactly greedy whatever the head drafts.

    Features come from the engine: :meth:`prefill_feedback` gives ``f[0..P-1]`` of the
    prompt, every :meth:`update` the rows of the root and the accepted nodes, i.e. exactly the
    features of every committed token except the newest (the bonus token, not yet run through
    the target). With a skip set they are the sparse target's features, automatically. The
    head keeps a KV cache over the committed pairs; tree slots are cropped after each draft.
    """

    # Confidence: the head's softmax probability of each node given its parent; distribution:
    # with return_probs, the head's distribution behind every node; replayable: proposals
    # depend on the context and the target features of committed tokens.
    capabilities = DrafterCapabilities(prefill_feedback=True, confidence=True, distribution=True, replayable=True)
    # Until a trained head's profile is measured (profile-eagle.json): Token Recycling's prior.
    sizing_prior = RANK_PRIOR

    def __init__(
        self,
        head: EagleHead,
        total_tokens: int = 60,
        depth: int = 6,
        top_k: int = 8,
        return_probs: bool = False,
        draft_vocab: int | None = None,
        sizer: ContextSized | None = None,
    ) -> None:
        if total_tokens < 2 or depth < 1 or top_k < 1:
            raise ValueError(
                f"EAGLE drafting needs total_tokens >= 2, depth >= 1, top_k >= 1; got total_tokens={total_tokens}, "
                f"depth={depth}, top_k={top_k}"
            )
        self.head = head
        self.total_tokens = total_tokens
        self.depth = depth
        self.sizer = sizer
        self.top_k = top_k
        self.return_probs = return_probs
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._features: torch.Tensor | None = None  # [m, H]: f[0..m-1]
        self._cache: DynamicCache | None = None
        self._cached_pairs = 0
        self._h_last: torch.Tensor | None = None
        self.last_scores: torch.Tensor | None = (
            None  # cumulative log-probs of the last tree's nodes
        )
        self.use_draft_vocab(draft_vocab)

    # ------------------------------------------------------------------------- draft vocabulary
    def use_draft_vocab(self, n: int | None) -> None:
        """Draft from the head's ``n`` most frequent tokens (``None``: all it carries; ``0``:
        the whole vocabulary). See the class docstring.

        Raises:
            ValueError: ``n`` is negative, or positive for a head without a draft vocabulary.
        """
        check_draft_vocab(self.head, n)
        carried = self.head.draft_vocab
        self.vocab_ids: torch.Tensor | None = None  # [N] target ids of draft row i; None = identity
        self._vocab_weight: torch.Tensor | None = None  # [N, H]: lm_head's rows of those ids
        self._vocab_bias: torch.Tensor | None = None
        if carried is None or n == 0:
            return
        ids = carried[:n] if n else carried
        lm = self.head.lm_head
        self.vocab_ids = ids.to(self.device)
        # A copy, once: indexing lm_head.weight per level would gather N rows every time.
        self._vocab_weight = lm.weight.detach()[self.vocab_ids].to(self.dtype).contiguous()
        bias = getattr(lm, "bias", None)
        self._vocab_bias = None if bias is None else bias.detach()[self.vocab_ids].to(self.dtype)

    def _draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` ``[..., H]`` -> logits over the draft vocabulary ``[..., N]`` (``[..., V]``
        without one)."""
        if self._vocab_weight is None:
            return self.head.lm_head(h)
        return torch.nn.functional.linear(h, self._vocab_weight, self._vocab_bias)

    def _target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary rows -> target token ids (the identity without one)."""
        return rows if self.vocab_ids is None else self.vocab_ids[rows]

    # ------------------------------------------------------------------------- features
    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._features = None
        self._cache = self.head.new_cache()
        self._cached_pairs = 0
        self._h_last = None

    def _append_features(self, rows: torch.Tensor) -> None:
        rows = rows.to(device=self.device, dtype=self.dtype)
        self._features = (
            rows if self._features is None else torch.cat([self._features, rows], dim=0)
        )

    def prefill_feedback(
        self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        self._features = None
        self._append_features(hidden)

    def update(self, feedback: VerifyFeedback) -> None:
        n = len(feedback.accepted)
        if list(feedback.accepted) == list(range(n)):  # a prefix of the slots: a view, no upload
            self._append_features(feedback.hidden[: n + 1])
            return
        rows = torch.tensor([0, *(i + 1 for i in feedback.accepted)], dtype=torch.long)  # root, then the path
        self._append_features(feedback.hidden[upload(rows, feedback.hidden.device)])

    @property
    def num_features(self) -> int:
        return 0 if self._features is None else int(self._features.shape[0])

    # ------------------------------------------------------------------------- drafting
    @torch.inference_mode()
    def propose(self, context: torch.Tensor) -> DraftTree:
        n_ctx = int(context.numel())
        if self._features is None or self.num_features != n_ctx - 1:
            raise RuntimeError(
                f"EagleDrafter holds target features for {self.num_features} tokens but the context has {n_ctx} "
                f"(expected {n_ctx - 1}); it must be driven by SpeculativeEngine, which calls prefill_feedback "
                "and update with the target's hidden states"
            )
        if self.sizer is not None:  # total_tokens=auto: this context's budget (none: a plain step)
            choice = self.sizer.at(n_ctx)
            if not choice.nodes:
                return DraftTree.empty()
            self.total_tokens, self.depth = choice.nodes + 1, choice.template.max_depth
        if self._cache is None:
            self._cache = self.head.new_cache()
        n_pairs = n_ctx - 1  # pair j = (t[j+1], f[j])
        h_last = self._extend_committed(context, n_pairs)
        tree, scores = self._grow_tree(h_last, n_pairs)
        crop_to(self._cache, n_pairs)  # drop the tree slots; keep the committed pairs
        self.last_scores = scores
        return tree

    def _extend_committed(self, context: torch.Tensor, n_pairs: int) -> torch.Tensor:
        """Run the pairs not yet in the head cache; return the head output at the last pair."""
        assert self._features is not None and self._cache is not None
        start = self._cached_pairs
        if start == n_pairs and self._h_last is not None:  # nothing new since the last draft
            return self._h_last
        ids = upload(context[start + 1 : n_pairs + 1], self.device).unsqueeze(0)  # [1, q]
        feats = self._features[start:n_pairs].unsqueeze(0)  # [1, q, H]
        q = n_pairs - start
        pos = torch.arange(start, n_pairs, device=self.device).unsqueeze(0)
        allowed = torch.ones(q, n_pairs, dtype=torch.bool, device=self.device)
        allowed[:, start:] = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        out = self.head(ids, feats, pos, additive_mask(allowed, self.dtype), self._cache)
        self._cached_pairs = n_pairs
        self._h_last = out[0, -1]
        return self._h_last

    def _grow_tree(self, h_last: torch.Tensor, n_pairs: int) -> tuple[DraftTree, torch.Tensor]:
        """EAGLE-2 expansion. Every candidate node ``u`` has a token, a parent and a score
        (cumulative log-probability); the ``top_k`` best candidates of a level are fed to
        the head (with their parent's predicted feature) to produce the next level.

        Nodes are numbered in creation order (level by level; within a level, by frontier row
        then child rank). Everything stays on the device until the one read-back before
        :meth:`_select`.
        """
        assert self._cache is not None
        head, k, dev = self.head, self.top_k, self.device
        logp = _log_probs(self._draft_logits(h_last))  # [N] (N = V without a draft vocabulary)
        top = logp.topk(k)
        top_tokens = self._target_ids(top.indices)  # [k] target ids
        # Per level, on the device: tokens [n_l], parents [n_l] (node ids; -1 = the root), scores [n_l].
        level_tokens = [top_tokens]
        level_parents = [torch.full((k,), -1, dtype=torch.long, device=dev)]
        level_scores = [top.values]
        n_nodes = k
        # return_probs: the distribution each node was drawn from (its parent's row) as an
        # index into `dists`, rows [V] of log-probabilities.
        dists: list[torch.Tensor] = [logp[None]] if self.return_probs else []
        node_dist: list[int] = [0] * k
        n_dist_rows = 1
        # The frontier (nodes fed to the head at this level): node ids, tokens, scores,
        # their parents' predicted features, and the tree slots of their strict ancestors.
        frontier = torch.arange(k, device=dev)  # [f]
        f_tokens, f_scores = top_tokens, top.values  # [f]
        parent_feature = h_last.unsqueeze(0).expand(k, -1)  # [f, H]
        ancestors = torch.zeros(k, 0, dtype=torch.bool, device=dev)  # [f, slots so far]
        for d in range(1, self.depth):
            f = int(frontier.shape[0])  # a shape, not a read of values
            # Tree slots: each fed node gets the next slot in the head cache (after the
            # committed pairs) and attends to the committed pairs, its ancestors and itself.
            tree_part = torch.cat([ancestors, torch.eye(f, dtype=torch.bool, device=dev)], dim=1)  # [f, S + f]
            allowed = torch.cat([torch.ones(f, n_pairs, dtype=torch.bool, device=dev), tree_part], dim=1)
            pos = torch.full((1, f), n_pairs - 1 + d, dtype=torch.long, device=dev)
            out = head(
                f_tokens.unsqueeze(0), parent_feature.unsqueeze(0), pos, additive_mask(allowed, self.dtype), self._cache
            )[0]
            lp = _log_probs(self._draft_logits(out))  # [f, N]
            top = lp.topk(k, dim=-1)
            top_tokens = self._target_ids(top.indices)  # [f, k] target ids
            cum = top.values + f_scores.to(lp.dtype)[:, None]  # [f, k]
            first_new = n_nodes
            if self.return_probs:
                node_dist.extend(n_dist_rows + r for r in range(f) for _ in range(k))
                dists.append(lp)
                n_dist_rows += f
            level_tokens.append(top_tokens.reshape(-1))
            level_parents.append(frontier.repeat_interleave(k))
            level_scores.append(cum.reshape(-1))
            n_nodes += f * k
            if d + 1 >= self.depth:
                break
            best = cum.reshape(-1).topk(min(k, f * k)).indices  # [f']: children to feed next
            frontier = first_new + best
            f_tokens = top_tokens.reshape(-1)[best]
            f_scores = cum.reshape(-1)[best]
            parent_feature = out[best // k]
            ancestors = tree_part[best // k]  # a child's strict ancestors: its parent's slots
        # The one read-back of the step: tokens and parents are exact in float64, and the
        # scores (float32 or wider) too.
        packed = torch.cat(
            [torch.cat(level_tokens).double(), torch.cat(level_parents).double(), torch.cat(level_scores).double()]
        ).tolist()
        tokens = [int(t) for t in packed[:n_nodes]]
        parents = [int(p) for p in packed[n_nodes : 2 * n_nodes]]
        scores = packed[2 * n_nodes :]
        probs = None
        if self.return_probs:
            probs = (torch.cat(dists), node_dist)
        return self._select(tokens, parents, scores, probs)

    def _select(
        self,
        tokens: list[int],
        parents: list[int],
        scores: list[float],
        probs: tuple[torch.Tensor, list[int]] | None = None,
    ) -> tuple[DraftTree, torch.Tensor]:
        """Keep the best ``total_tokens - 1`` candidates; ties go to the earlier node, so a
        parent (score >= its child's, created first) always precedes its children."""
        budget = self.total_tokens - 1
        order = sorted(range(len(tokens)), key=lambda u: (-scores[u], u))
        chosen: set[int] = set()
        for u in order:
            if len(chosen) >= budget:
                break
            if parents[u] == -1 or parents[u] in chosen:
                chosen.add(u)
        keep = sorted(chosen)  # creation order: parents before children
        index = {u: i for i, u in enumerate(keep)}
        # Scores are cumulative log-probabilities: a node's own (local) probability is
        # exp(score - parent's score).
        local = [scores[u] - (0.0 if parents[u] == -1 else scores[parents[u]]) for u in keep]
        node_probs = None
        if probs is not None:  # rows of log-probabilities -> each kept node's distribution
            rows, node_dist = probs
            # (not `index`: that maps kept nodes to their new positions, for the parents below)
            dist_rows = upload(torch.tensor([node_dist[u] for u in keep], dtype=torch.long), rows.device)
            node_probs = rows[dist_rows].float().exp()  # [n, N]
            if self.vocab_ids is not None:  # 0 outside the draft vocabulary: a distribution over [V]
                full = torch.zeros(node_probs.shape[0], int(self.head.lm_head.weight.shape[0]), device=node_probs.device)
                node_probs = full.index_copy_(1, self.vocab_ids.to(node_probs.device), node_probs)  # [n, V]
        tree = DraftTree(
            tokens=torch.tensor([tokens[u] for u in keep], dtype=torch.long),
            parents=tuple(-1 if parents[u] == -1 else index[parents[u]] for u in keep),
            confidence=torch.tensor(local, dtype=torch.float64).exp().float(),
            probs=node_probs,
            sampled=False,
        )
        return tree, torch.tensor([scores[u] for u in keep], dtype=torch.float64)


def sized_eagle(
    target: TargetModel,
    head: EagleHead,
    *,
    depth: int = 6,
    top_k: int = 8,
    return_probs: bool = False,
    directory: str | Path | None = None,
) -> Drafter:
    """``drafter=eagle total_tokens=auto``: per context bucket, the EAGLE-2 budget
    (``total_tokens`` = nodes + 1, depth) that maximises expected tokens per second, from the
    latency table for that cached length, the ``eagle`` profile (``profile-eagle.json``, else
    :attr:`EagleDrafter.sizing_prior`) and the head's measured cost per level (cached per
    hardware key, so every build chooses the same trees); :class:`NoDrafter` when no tree pays
    at any context (its ``sizer`` says why)."""
    accept = load_profile("eagle", EagleDrafter.sizing_prior, directory).truncated(top_k)
    level_s = load_or_measure_draft_cost(
        target, f"eagle_level_d{depth}_k{top_k}",
        lambda: draft_seconds_per_level(target, EagleDrafter(head, total_tokens=60, depth=depth, top_k=top_k),
                                        depth=depth),
        directory,
    )
    sizer = ContextSized.tree(target, accept, max_depth=depth, draft_s=lambda t: level_s * t.max_depth,
                              directory=directory)
    if sizer.never_speculates:
        drafter: Drafter = NoDrafter()
        drafter.sizer = sizer
        return drafter
    # The shortest context's budget (or the largest, where that one drafts nothing); each
    # propose sets its own bucket's.
    first = sizer.first if sizer.first.nodes else max(sizer.choices.values(), key=lambda c: c.nodes)
    return EagleDrafter(head, total_tokens=first.nodes + 1, depth=first.template.max_depth, top_k=top_k,
                        return_probs=return_probs, sizer=sizer)


@builds(EagleDrafter)
def build_eagle(
    target: TargetModel,
    loaded: LoadedModel,
    *,
    checkpoint: str | None = None,
    path: str | None,
    random_init: bool,
    seed: int,
    total_tokens: int | str,
    depth: int,
    top_k: int,
    return_probs: bool,
    draft_vocab: int | None,
    weights: WeightCache | None = None,
) -> Drafter:
    """EAGLE-1 head from ``checkpoint`` (``path`` is its older name, still accepted), or a
    random head with ``random_init``; EAGLE-2 tree of ``total_tokens`` (``auto``, the
    default: sized per context length with ``depth`` and ``top_k`` as caps, :func:`sized_eagle`)
    over the head's draft vocabulary (``draft_vocab``: null = the head's, 0 = the whole
    vocabulary, N = its N most frequent)."""
    given = [v for v in (checkpoint, path) if v]
    if len(given) == 2 and str(checkpoint) != str(path):
        raise DrafterConfigError(
            f"drafter 'eagle' got drafter.checkpoint={checkpoint!r} and drafter.path={path!r}; "
            "path is the older name of checkpoint: give only drafter.checkpoint"
        )
    cache = weights or WeightCache()
    if random_init:
        head = cache.get(f"random:{seed}", lambda: random_eagle_head(target.model, seed=seed), target.model)
    elif not given:
        raise DrafterConfigError(
            "drafter 'eagle' needs drafter.checkpoint (a directory with config.json + pytorch_model.bin, "
            "e.g. one written by python -m tss_opt.cli.train_drafter), or drafter.random_init=true for a random head"
        )
    else:
        directory = str(given[0])
        head = cache.get(f"path:{directory}", lambda: load_eagle_head(directory, target.model), target.model)
        warn_other_model(directory, loaded.config.name)
    try:  # a bad setting is refused whatever the sizing below decides (NoDrafter included)
        check_draft_vocab(head, draft_vocab)
    except ValueError as e:
        raise DrafterConfigError(str(e)) from e
    drafter: Drafter
    if total_tokens == AUTO:
        # sized with the head's own draft vocabulary (its per-level cost is measured with it);
        # another drafter.draft_vocab below changes that cost, not the tree's correctness
        need_target("eagle", "total_tokens", target)
        drafter = sized_eagle(target, head, depth=depth, top_k=top_k, return_probs=return_probs)
    else:
        drafter = EagleDrafter(head, total_tokens=fixed_size("eagle", "total_tokens", total_tokens), depth=depth,
                               top_k=top_k, return_probs=return_probs)
    if isinstance(drafter, EagleDrafter):  # total_tokens=auto may decide that no tree pays (NoDrafter)
        try:
            drafter.use_draft_vocab(draft_vocab)
        except ValueError as e:
            raise DrafterConfigError(str(e)) from e
    return drafter
