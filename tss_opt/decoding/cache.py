"""KV-cache helpers that stay correct when some layers are skipped.

Skipped layers do not grow their cache, so layers differ in length. Two FACTS.md pitfalls
follow: (1) transformers sizes masks and positions from layer 0, which may be a skipped
(empty or shorter) layer; (2) ``crop(-n)`` removes ``n`` tokens from every layer and
over-crops the skipped ones. :class:`SkipAwareCache` answers size questions from the longest
layer, and :func:`keep_accepted` rolls back per layer to an absolute length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from tss_opt.decoding.host_syncs import upload


class SkipAwareCache(DynamicCache):
    """A ``DynamicCache`` whose global length is that of its longest layer (a layer that ran)."""

    def get_seq_length(self, layer_idx: int = 0) -> int:  # noqa: D102
        lengths = [layer.get_seq_length() for layer in self.layers if getattr(layer, "is_initialized", False)]
        return max(lengths, default=0)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:  # noqa: D102
        return self.get_seq_length() + query_length, 0


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
