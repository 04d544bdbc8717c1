"""KV-cache helpers that stay correct when some layers are skipped.

Skipped layers do not grow their cache, so layers differ in length. Two FACTS.md pitfalls
follow: (1) transformers sizes masks and positions from layer 0, which may be a skipped
(empty or shorter) layer; (2) ``crop(-n)`` removes ``n`` tokens from every layer and
over-crops the skipped ones. :class:`SkipAwareCache` answers size questions from the longest
layer, and :func:`keep_accepted` rolls back per layer to an absolute length.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from tss_opt.decoding.host_syncs import upload


def _cache_keyword() -> str:
    """The forward keyword that carries a KV cache into a transformers model or layer.

    ``cache`` from transformers 5.2x on (``past_key_values`` deprecated there); before, as in
    5.19 (the release vLLM 0.32 pins), it is ``past_key_values``, and ``cache=`` lands in
    ``**kwargs`` unread: every forward then builds a fresh cache and attends to its own tokens
    only, silently. Read once from Llama's signature, the convention every model follows.
    """
    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


CACHE_KEYWORD = _cache_keyword()

TREE_ROOM = 64
"""Positions a request's cache holds beyond its prompt and output: a draft tree's slots while
it is verified (a larger tree grows the buffer once, :class:`InPlaceLayer`)."""


def request_capacity(prompt_len: int, max_new_tokens: int) -> int:
    """Positions a request's in-place cache is made with: its prompt, its output and
    :data:`TREE_ROOM` (the engine's and the batch engine's requests)."""
    return prompt_len + max_new_tokens + TREE_ROOM


def with_cache(cache: DynamicCache | None) -> dict[str, Any]:
    """``{keyword: cache}`` for a model's or a decoder layer's forward (``**with_cache(c)``)."""
    return {CACHE_KEYWORD: cache}


class SkipAwareCache(DynamicCache):
    """A ``DynamicCache`` whose global length is that of its longest layer (a layer that ran).

    Args:
        capacity: ``None``: layers grow by concatenation (transformers' own layers). An
            integer: every layer appends in place into a buffer of that many positions
            (:class:`InPlaceLayer`), so a step costs its new tokens rather than a copy of the
            whole cache (every request of the engines, sized by :func:`request_capacity`).
    """

    def __init__(self, *args: object, capacity: int | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if capacity is not None:
            self.layers = [InPlaceLayer(capacity) for _ in self.layers]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # noqa: D102
        lengths = [layer.get_seq_length() for layer in self.layers if getattr(layer, "is_initialized", False)]
        return max(lengths, default=0)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:  # noqa: D102
        return self.get_seq_length() + query_length, 0


class InPlaceLayer(DynamicLayer):
    """A cache layer that appends into a preallocated buffer instead of concatenating.

    ``DynamicLayer.update`` concatenates, copying every cached token at every step: for one
    request that is small next to the weights a step reads, but at 16 rows of 700 cached
    tokens (SmolLM2, float32) it is about as many bytes as the weights. Here ``keys`` and
    ``values`` are views of the first ``length`` positions of buffers of ``capacity``
    positions (doubled if a request ever outgrows them); assigning a shorter prefix view
    (how :func:`keep_accepted` and :func:`crop_to` roll back) only moves the length, and
    in-place writes through the views land in the buffers.
    """

    def __init__(self, capacity: int) -> None:
        self._buf: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._len = {"keys": 0, "values": 0}
        self.capacity = max(1, int(capacity))
        super().__init__()

    def _get(self, name: str) -> torch.Tensor | None:
        buf = self._buf[name]
        return None if buf is None else buf.narrow(-2, 0, self._len[name])  # narrow: cheaper than [..., :n, :] (engine.md)

    def _set(self, name: str, value: torch.Tensor | None) -> None:
        buf = self._buf[name]
        if value is None:
            self._buf[name], self._len[name] = None, 0
            return
        n = value.shape[-2] if value.dim() >= 2 else 0
        if buf is not None and value.dim() == buf.dim() and value.data_ptr() == buf.data_ptr() and n <= buf.shape[-2]:
            self._len[name] = n  # a prefix view of the buffer: a rollback, nothing to copy
            return
        if value.dim() < 2:  # lazy_initialization's empty tensor: allocate at the first update
            self._buf[name], self._len[name] = None, 0
            self._dtype, self._device = value.dtype, value.device
            return
        self._buf[name] = None
        self._ensure(name, value, n)
        self._buf[name][..., :n, :] = value  # type: ignore[index]
        self._len[name] = n

    def _ensure(self, name: str, like: torch.Tensor, need: int) -> None:
        buf = self._buf[name]
        if buf is not None and buf.shape[-2] >= need:
            return
        size = max(need, self.capacity if buf is None else 2 * buf.shape[-2])
        # Zeros, not empty: the compiled step's attention reads a window past the cached length
        # (masked), and a masked NaN left in fresh memory still poisons ``softmax @ V``
        # (0 * NaN); measured in bfloat16 on this CPU (decoding/compiled.py).
        new = torch.zeros((*like.shape[:-2], size, like.shape[-1]), dtype=like.dtype, device=like.device)
        if buf is not None:
            new[..., : self._len[name], :] = buf[..., : self._len[name], :]
        self._buf[name] = new

    def buffers(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers (``[B, H_kv, C, D]`` each, ``C >= width``: grown to fit),
        to be written in place past the cached length (the compiled step,
        ``decoding/compiled.py``); :meth:`set_length` then says how many positions are cached."""
        for name in ("keys", "values"):
            self._ensure(name, self._buf[name], width)  # type: ignore[arg-type]
        return self._buf["keys"], self._buf["values"]  # type: ignore[return-value]

    def set_length(self, n: int) -> None:
        """``n`` positions of the buffers are cached (written in place through :meth:`buffers`)."""
        self._len["keys"] = self._len["values"] = n

    keys = property(lambda self: self._get("keys"), lambda self, v: self._set("keys", v))  # type: ignore[assignment]
    values = property(lambda self: self._get("values"), lambda self, v: self._set("values", v))  # type: ignore[assignment]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys and values after the cached ones (``[B, H_kv, n, D]`` each);
        returns views of everything cached."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        out = []
        for name, new in (("keys", key_states), ("values", value_states)):
            n0, n = self._len[name], new.shape[-2]
            self._ensure(name, new, n0 + n)
            buf = self._buf[name]
            buf.narrow(-2, n0, n).copy_(new)  # type: ignore[union-attr]
            self._len[name] = n0 + n
            out.append(buf.narrow(-2, 0, n0 + n))  # type: ignore[union-attr]
        return out[0], out[1]


def preallocate(cache: DynamicCache, capacity: int) -> None:
    """Make every layer of ``cache`` an :class:`InPlaceLayer` of at least ``capacity``
    positions, copying what a growing layer holds (once; layers already in place are left
    alone). A compiled step writes into fixed buffers (``decoding/compiled.py``), while caches
    made and kept elsewhere (the prefill store's copies) stay as compact as they were."""
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, InPlaceLayer):
            continue
        fixed = InPlaceLayer(capacity)
        if getattr(layer, "is_initialized", False):
            fixed.lazy_initialization(layer.keys, layer.values)
            fixed.keys, fixed.values = layer.keys, layer.values  # copied into the new buffers
        cache.layers[i] = fixed


def crop_to(cache: DynamicCache, length: int) -> None:
    """Cut every layer longer than ``length`` back to ``length`` tokens (absolute, per layer)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_accepted(cache: DynamicCache, prefix_len: int, step_len: int, keep: Sequence[int]) -> None:
    """Keep only the accepted slots of the last verification step.

    Args:
        cache: the target's cache after a forward of ``step_len`` new slots on ``prefix_len``.
        prefix_len: cached length before the step (layers that ran).
        step_len: slots the step appended (root plus tree nodes).
        keep: offsets in ``[0, step_len)`` to keep, in path order (root first).

    Layers whose length is not ``prefix_len + step_len`` did not run in that step (skipped)
    and are left alone.
    """
    grown = prefix_len + step_len
    n_keep = len(keep)
    layers = [
        layer for layer in cache.layers
        if getattr(layer, "is_initialized", False) and layer.keys.shape[-2] == grown
    ]
    contiguous = list(keep) == list(range(n_keep))
    idx = None
    if not contiguous and layers:
        # One index per step, built on the cache's device (one upload, not one per layer).
        idx = upload(torch.tensor([prefix_len + k for k in keep], dtype=torch.long), layers[0].keys.device)
    for layer in layers:
        if idx is not None:
            # keys: [B, H_kv, S, D]; gather the accepted path behind the prefix, then crop.
            layer.keys[..., prefix_len : prefix_len + n_keep, :] = layer.keys.index_select(-2, idx)
            layer.values[..., prefix_len : prefix_len + n_keep, :] = layer.values.index_select(-2, idx)
        layer.keys = layer.keys[..., : prefix_len + n_keep, :]
        layer.values = layer.values[..., : prefix_len + n_keep, :]
