"""The EAGLE-1 draft head as a module (Li et al. 2024, arXiv 2401.15077).

The head sees the target's final hidden states ("features", after the final norm) of the
committed tokens: pair ``j`` is ``concat(embed(t[j+1]), f[j])``, projected by ``fc``
(``2H -> H``) and run through one Llama decoder layer; its output predicts the next feature
``f[j+1]``, which the target's own ``lm_head`` turns into a distribution over ``t[j+2]``. The
head reuses the target's ``embed_tokens`` and ``lm_head`` (references, not copies).
Checkpoints: eagle_checkpoint.py; drafting a tree with it: eagle.py.

A head may carry a **draft vocabulary** (FR-Spec, arXiv 2502.14856; EAGLE-3's ``d2t``): the
target token ids it drafts from, most frequent first. Projecting onto ``N`` rows of
``lm_head`` instead of all ``V`` is what makes a tree level cheap (the full 49k
projection was most of EAGLE's drafting time on a CPU). The head only stores the list; the
drafter decides how many of it to use (``drafter.draft_vocab``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from tss_opt.decoding.cache import with_cache
from tss_opt.decoding.target import additive_mask as target_additive_mask


def _causal_lm(target_model: Any) -> Any:
    """Accept a :class:`TargetModel` or a transformers causal LM."""
    if hasattr(target_model, "get_input_embeddings"):
        return target_model
    return target_model.model


class EagleHead(nn.Module):
    """``fc`` over ``concat(embedding, feature)`` plus Llama decoder layer(s).

    Args:
        config: the head's Llama config (``hidden_size`` must equal the target's).
        embed_tokens: the target's input embedding (kept by reference, not registered).
        lm_head: the target's output projection (kept by reference, not registered).
        bias: whether ``fc`` has a bias (EAGLE-1 checkpoints do).
        first_layer_norm: give layer 0 an ``input_layernorm`` (EAGLE-1 has none).
    """

    def __init__(
        self,
        config: LlamaConfig,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        bias: bool = True,
        first_layer_norm: bool = False,
    ) -> None:
        super().__init__()
        if config._attn_implementation is None:
            config._attn_implementation = "sdpa"  # takes the explicit 4-D additive mask as given
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        layers = []
        for i in range(config.num_hidden_layers):
            layer = LlamaDecoderLayer(config, layer_idx=i)
            if i == 0 and not first_layer_norm:
                layer.input_layernorm = nn.Identity()
            layers.append(layer)
        self.layers = nn.ModuleList(layers)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # Plain attributes, not submodules: neither in state_dict nor moved/cast with the head.
        object.__setattr__(self, "_target_modules", (embed_tokens, lm_head))
        # Target ids, most frequent first (None: no draft vocabulary). A buffer, so it is saved
        # in the state dict and moves with the head; an integer buffer is never cast by .to(dtype).
        self.register_buffer("draft_vocab", None)

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Attach (or, with ``None``, remove) the draft vocabulary.

        Args:
            ids: ``torch.LongTensor`` of shape ``(N,)``: distinct target token ids in
                ``[0, vocab_size)``, most frequent first.

        Raises:
            ValueError: not a 1-D list of distinct ids of the target's vocabulary.
        """
        if ids is None:
            self.draft_vocab = None
            return
        ids = torch.as_tensor(ids).reshape(-1)
        vocab = int(self.lm_head.weight.shape[0])
        if ids.dtype.is_floating_point or ids.numel() == 0:
            raise ValueError(f"a draft vocabulary is a non-empty list of token ids; got {ids.numel()} {ids.dtype} values")
        ids = ids.long()
        if int(ids.min()) < 0 or int(ids.max()) >= vocab or int(ids.unique().numel()) != int(ids.numel()):
            raise ValueError(
                f"a draft vocabulary holds distinct token ids in [0, {vocab}); got {ids.numel()} ids in "
                f"[{int(ids.min())}, {int(ids.max())}] with {int(ids.numel()) - int(ids.unique().numel())} repeated"
            )
        self.draft_vocab = ids.to(self.fc.weight.device)

    @property
    def embed_tokens(self) -> nn.Module:
        return self._target_modules[0]

    @property
    def lm_head(self) -> nn.Module:
        return self._target_modules[1]

    @property
    def has_bias(self) -> bool:
        return self.fc.bias is not None

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Predict next features.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, q)``: token ``t[j+1]`` of pair ``j``.
            features: ``torch.FloatTensor`` of shape ``(1, q, hidden)``: feature ``f[j]``.
            position_ids: ``torch.LongTensor`` of shape ``(1, q)``.
            attention_mask: additive ``(1, 1, q, cached + q)`` mask; ``None`` = causal
                without a cache.
            cache: the head's own KV cache, appended to.

        Returns:
            ``torch.FloatTensor`` of shape ``(1, q, hidden)``: predicted features
            (``lm_head`` of them gives next-token logits).
        """
        emb = self.embed_tokens(input_ids).to(features.dtype)
        h = self.fc(torch.cat([emb, features], dim=-1))  # [1, q, H]
        if attention_mask is None:
            if cache is not None and cache.get_seq_length() > 0:
                raise ValueError(
                    "EagleHead.forward with a non-empty cache needs an explicit attention_mask"
                )
            q = h.shape[1]
            allowed = torch.ones(q, q, dtype=torch.bool, device=h.device).tril()
            attention_mask = additive_mask(allowed, h.dtype)
        pos_emb = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(
                h,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **with_cache(cache),
                use_cache=cache is not None,
                position_embeddings=pos_emb,
            )
        return h


def frequent_tokens(tokens: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` most frequent ids of ``tokens`` (fewer when fewer distinct ids occur), most
    frequent first; ties go to the smaller id, so the list is deterministic.

    Args:
        tokens: ``torch.LongTensor`` of any shape.

    Returns:
        ``torch.LongTensor`` of shape ``(min(n, distinct),)`` on the CPU.
    """
    ids, counts = tokens.reshape(-1).cpu().unique(return_counts=True)  # ids ascending
    order = torch.argsort(-counts, stable=True)  # stable: equal counts keep the smaller id first
    return ids[order][:n].clone()


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(q, kv)`` bool -> ``(1, 1, q, kv)`` additive float mask: the target's rule
    (:func:`tss_opt.decoding.target.additive_mask`) with the head's batch and head dims."""
    return target_additive_mask(allowed, dtype)[None, None]


def _head_config_for(target_config: Any) -> LlamaConfig:
    """A one-layer Llama config with the target's shapes (for random heads)."""
    d = target_config.to_dict()
    d.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], model_type="llama")
    return LlamaConfig.from_dict(d)


def random_eagle_head(target_model: Any, seed: int = 0) -> EagleHead:
    """A randomly initialised head with the target's shapes (tests, plumbing checks).

    Args:
        target_model: a :class:`TargetModel` or a transformers causal LM (Llama-like).
        seed: the same seed gives the same weights; the global RNG is left untouched.
    """
    lm = _causal_lm(target_model)
    config = _head_config_for(lm.config)
    p = next(lm.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(config, lm.get_input_embeddings(), lm.get_output_embeddings(), bias=True)
    return head.to(device=p.device, dtype=p.dtype).eval()
