"""The target (verifier) model: forwards over a cached prefix, with tree attention."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from tss_opt.decoding.attention import verify_attention
from tss_opt.decoding.cache import SkipAwareCache, with_cache
from tss_opt.decoding.host_syncs import upload
from tss_opt.decoding.linear import is_packed, pack_linears, packed_linears
from tss_opt.decoding.skip import SkipController
from tss_opt.decoding.tree import DraftTree
from tss_opt.errors import TSSError


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention mask the model is given, from which slot may attend to which.

    Args:
        allowed: bool mask of any shape (``(q, kv)``, ``(B, q, kv)``...): True where a query
            may attend to a key.

    Returns:
        A ``dtype`` tensor of the same shape on the same device: 0 where allowed, the dtype's
        minimum elsewhere. The one rule for every 4-D mask we build (verification, the replay,
        the EAGLE head): a bool or 0/1 mask is silently wrong under "eager" attention
        (FACTS.md); callers add the head dimension.
    """
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask


class ContextLengthError(TSSError):
    """A prompt (plus the tokens to generate) does not fit the model's context."""


class TargetModel:
    """A causal LM seen as the speculative-decoding target.

    Args:
        model: a transformers causal LM (decoder + ``lm_head``), in eval mode.
        layers_path: attribute path of the decoder-layer list (model facts are config).
        max_context: positions the model supports; defaults to ``max_position_embeddings``.
    """

    #: Whether verification runs a compiled step (:class:`~tss_opt.decoding.compiled.CompiledTarget`):
    #: sizing keys its latency tables by it, since the two steps cost differently.
    compiled = False
    #: Verified-slot counts a step is padded to (root + nodes; empty: none, a step costs what
    #: its slots cost). A compiled step pads (``decoding/compiled.py``, ``BUCKETS``), so a
    #: chain of 8 costs what one of 15 does: sizing measures and prices it per bucket.
    slot_buckets: tuple[int, ...] = ()

    def __init__(self, model: Any, layers_path: str = "model.layers", max_context: int | None = None) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.skipper = SkipController.for_model(model, layers_path)
        self.num_layers = self.skipper.num_layers
        self.max_context = int(max_context or getattr(model.config, "max_position_embeddings", 1 << 30))
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # bfloat16 on a CPU: every linear layer's weight reordered once for oneDNN, used by our
        # forwards (packed_linears) for a step's few rows (decoding/linear.py: 1.5-2.6x faster
        # products, the same outputs); a no-op for any other dtype or device.
        pack_linears(model)
        self.packed = is_packed(model)

    def skip(self, layers: Iterable[int]) -> AbstractContextManager[frozenset[int]]:
        """Context manager: bypass ``layers`` (the project's one skip mechanism)."""
        return self.skipper.apply(layers)

    def new_cache(self, capacity: int | None = None) -> SkipAwareCache:
        """An empty KV cache; ``capacity`` (positions): layers append in place into buffers
        of that size instead of concatenating (``cache.InPlaceLayer``)."""
        return SkipAwareCache(config=self.model.config, capacity=capacity)

    def positions_needed(self, prompt_len: int, max_new_tokens: int, max_draft: int = 0) -> int:
        """Positions a request uses at most: the prompt, every new token, the draft slots of a
        step and the bonus token's slot (the one rule of the context fit: ``check_fits``, the
        server's 400 and the training data's filter all ask it)."""
        return prompt_len + max_new_tokens + max_draft + 1

    def fits(self, prompt_len: int, max_new_tokens: int, max_draft: int = 0) -> bool:
        """Whether such a request fits the model's ``max_context`` positions."""
        return self.positions_needed(prompt_len, max_new_tokens, max_draft) <= self.max_context

    def check_fits(self, prompt_len: int, max_new_tokens: int, max_draft: int = 0) -> None:
        """Raise :class:`ContextLengthError` (naming the fix) when the request does not fit."""
        need = self.positions_needed(prompt_len, max_new_tokens, max_draft)
        if need > self.max_context:
            raise ContextLengthError(
                f"the prompt has {prompt_len} tokens; with max_new_tokens={max_new_tokens} (+{max_draft} draft "
                f"slots) it needs {need} positions but the model supports {self.max_context}. "
                "Shorten the prompt or lower max_new_tokens."
            )

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor, cache: SkipAwareCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt through the model, filling ``cache``.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.

        Returns:
            ``(logits, hidden)``: ``logits`` of shape ``(1, vocab)`` at the last position only
            (projecting every position costs ``P x vocab``), ``hidden`` of shape ``(P, hidden)``.
        """
        ids = prompt_ids.to(self.device).unsqueeze(0)
        pos = torch.arange(ids.shape[1], device=self.device).unsqueeze(0)
        with packed_linears():
            out = self.decoder(input_ids=ids, position_ids=pos, **with_cache(cache), use_cache=True)
            hidden = out.last_hidden_state[0]  # [P, H]
            return self.lm_head(hidden[-1:]), hidden

    @torch.inference_mode()
    def verify_forward(
        self, root_token: int, tree: DraftTree, cache: SkipAwareCache, prefix_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over ``[root] + tree`` on a cached prefix of ``prefix_len`` tokens.

        Every slot attends to the whole prefix, its ancestors and itself; positions are
        ``prefix_len + depth`` (FACTS.md: an explicit additive 4-D float mask plus explicit
        ``position_ids``; a 4-D mask is used as given and never asks the cache for sizes, so
        skipped layers with shorter caches cannot corrupt it).

        Returns:
            ``(logits, hidden)`` of shapes ``(n + 1, vocab)`` and ``(n + 1, hidden)``: row 0
            is the root, row ``i + 1`` is node ``i``.
        """
        n1 = len(tree) + 1
        # ids and positions built on the host, uploaded together without a stream sync.
        host = torch.empty(2, n1, dtype=torch.long)
        host[0, 0] = root_token
        if n1 > 1:
            host[0, 1:] = tree.tokens
        host[1] = prefix_len + torch.tensor((0, *tree.depth), dtype=torch.long)
        both = upload(host, self.device)
        ids, pos = both[0:1], both[1:2]  # [1, n+1] each
        mask = self.tree_mask(tree, prefix_len)
        # A step's few positions: SDPA's CPU kernel is slow there in half precision, and so is
        # F.linear's per-call weight reorder (attention.py, linear.py).
        with verify_attention(self.model), packed_linears():
            out = self.decoder(input_ids=ids, position_ids=pos, attention_mask=mask, **with_cache(cache), use_cache=True)
            hidden = out.last_hidden_state[0]  # [n+1, H]
            return self.lm_head(hidden), hidden

    def tree_mask(self, tree: DraftTree, prefix_len: int) -> torch.Tensor:
        """Additive mask of shape ``(1, 1, n + 1, prefix_len + n + 1)``: 0 where a slot may
        attend, the dtype's minimum elsewhere (a bool or 0/1 mask is silently wrong under
        "eager" attention, FACTS.md)."""
        allowed = upload(tree.ancestor_matrix(), self.device)  # [n+1, n+1]
        n1 = allowed.shape[0]
        mask = torch.zeros(1, 1, n1, prefix_len + n1, dtype=self.dtype, device=self.device)
        mask[0, 0, :, prefix_len:] = additive_mask(allowed, self.dtype)  # the prefix: all allowed (0)
        return mask
