"""The attention every verification forward of ours runs: transformers' SDPA attention, except
for a few query positions in half precision on a CPU, where it is far from the limit.

On this CPU (one thread, SmolLM2's 9 query / 3 key-value heads of 64), PyTorch's CPU flash
kernel for bfloat16 takes 0.9 ms for **one** query position over 896 cached keys, against
0.17 ms for the same product in float32 math (upcast, ``q @ k^T``, softmax, ``@ v``) and
0.32 ms for four query positions in the same kernel: a plain step (one position, every
layer) spent 9 of its ~47 ms there at 800 cached tokens, more than all its MLPs. float32 does
not have the problem (0.11 ms), so float32 and float64 keep transformers' SDPA call exactly,
bit for bit.

In bfloat16 on a CPU with AVX-512 BF16 the short-query path runs our kernel
(``kernels/attention.py``, since 2026-12-06): the same float32 math reading the cache's bfloat16
window once, where upcasting it made the compiled step write the window out twice in float32
(at 896 cached positions of SmolLM2 about 0.2 ms a layer, against 0.03 ms to read it).

:func:`attend` is a drop-in for ``sdpa_attention_forward`` (transformers' attention contract);
the short-query path computes in float32 from the half-precision keys and values, as the
flash kernel accumulates, and returns the dtype's values: a different summation order, so a
half-precision run can part from one that used SDPA at a near-tie (the lossless rule of
:mod:`tss_opt.decoding.lossless`), never by more. It needs the mask we always pass (additive
or boolean, 4-D) or a single query position; anything else (a causal prompt without a mask,
attention sinks) goes to SDPA.

:func:`verify_attention` selects it for the forwards in its body (the target's verification
steps, the compiled step); the ragged forward of the batch engine calls :func:`attend` per row.
transformers' own ``generate`` on the same model keeps the model's SDPA attention (so the
benchmarks' transformers baseline is transformers as shipped).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tss_opt.decoding.dtypes import HALF_DTYPES
from tss_opt.decoding.kernels import attention as attention_kernel

__all__ = ["ATTENTION_NAME", "SHORT_QUERY", "attend", "attention_selected", "short_query_attention", "verify_attention"]

ATTENTION_NAME = "tss_verify"

SHORT_QUERY = 4
"""Query positions up to which half precision on a CPU takes the float32 math path (measured:
faster than the flash kernel from 1 to 4 positions at 128-2048 cached keys; at 16 the two are
even)."""

def _short(query: torch.Tensor, attention_mask: torch.Tensor | None, module: torch.nn.Module) -> bool:
    """Whether the float32 math path applies (see the module's docstring)."""
    return (
        query.device.type == "cpu"
        and query.dtype in HALF_DTYPES
        and query.shape[2] <= SHORT_QUERY
        and (attention_mask is not None or query.shape[2] == 1)
        and getattr(module, "sinks", None) is None
    )


def short_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of a few query positions in float32 math, grouped-query heads without copies
    (through our kernel, ``kernels/attention.py``, where it runs and takes the shapes).

    Args:
        query: ``(b, H, q, D)``.
        key, value: ``(b, H_kv, W, D)``, ``H`` a multiple of ``H_kv`` (head ``h`` reads
            key-value head ``h // (H / H_kv)``, transformers' ``repeat_kv``).
        attention_mask: additive (0 / dtype minimum) or boolean (True: attend), broadcastable
            to ``(b, H, q, W')`` with ``W' >= W`` (its first ``W`` keys are used, as in SDPA);
            ``None``: every key (one query position: the last one sees the whole prefix).
        scaling: the scores' factor; ``None``: ``1 / sqrt(D)``.

    Returns:
        ``(b, q, H, D)`` in ``query``'s dtype (transformers' attention output layout).
    """
    b, heads, q, d = query.shape
    kv_heads, w = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = d**-0.5 if scaling is None else scaling
    if attention_kernel.available() and attention_kernel.fits(query, key, value, attention_mask):
        # The same math reading the bfloat16 window once (kernels/attention.py), where it runs.
        return attention_kernel.short_attention(query, key, value, attention_mask, scale)
    # [b, H_kv, groups * q, D]: the query heads sharing a key-value head as rows of one product.
    qf = query.float().reshape(b, kv_heads, groups * q, d)
    scores = (qf @ key.float().transpose(-1, -2)).mul_(scale).view(b, kv_heads, groups, q, w)
    if attention_mask is not None:
        mask = attention_mask[..., :w]
        mask = mask.expand(b, heads, q, w).reshape(b, kv_heads, groups, q, w) if mask.shape[1] != 1 else mask[:, :, None]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    probs = scores.softmax(-1).view(b, kv_heads, groups * q, w)
    out = (probs @ value.float()).view(b, heads, q, d)  # [b, H, q, D]
    return out.transpose(1, 2).to(query.dtype).contiguous()


def attend(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa_attention_forward``, or :func:`short_query_attention` where it
    applies (half precision on a CPU, at most :data:`SHORT_QUERY` query positions).

    Args:
        query: ``(b, H, q, D)``; key, value: ``(b, H_kv, W, D)``.

    Returns:
        ``(b, q, H, D)`` and no weights (transformers' attention contract).
    """
    if _short(query, attention_mask, module):
        return short_query_attention(query, key, value, attention_mask, scaling), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


AttentionInterface.register(ATTENTION_NAME, attend)


@contextmanager
def attention_selected(model: Any, name: str) -> Iterator[None]:
    """The registered attention ``name`` for the forwards in the body; the model's own
    implementation returns on exit, always (the one way this project switches attention:
    here and for the ragged forward)."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


@contextmanager
def verify_attention(model: Any) -> Iterator[None]:
    """Select :func:`attend` for the forwards in the body when the model runs SDPA (another
    implementation is left alone); the model's own returns on exit, always."""
    if model.config._attn_implementation != "sdpa":
        yield
        return
    with attention_selected(model, ATTENTION_NAME):
        yield
