"""Our attention of a step's few query positions over a bfloat16 cache (``attention_bf16.c``).

The float32 math path of :func:`~tss_opt.decoding.attention.short_query_attention` (a step of
1 to 4 positions in half precision on a CPU) upcasts the keys and values it reads, so inside
the compiled step inductor writes both windows out in float32 and multiplies them through two
batched products: at 896 cached positions of SmolLM2 about 0.2 ms a layer, 6 ms of a 20 ms
bfloat16 step, where reading the window once takes 0.03 ms (one thread, the AMD EPYC of
docs/engine.md, profiled). ``attention_bf16.c`` reads each key and value row once from the
cache's own buffer (AVX-512 BF16 dot products, float32 softmax and sums, one rounding to
bfloat16 at the end), and :func:`short_attention` is a torch operator
(``tss_opt::short_attention``), so the compiled graphs call it as they call the rows kernel.

Built and loaded as the rows kernel is (``rows.py``: the system's C compiler at first use, a
per-user cache, ``ctypes``), on the same CPUs. ``TSS_ATTENTION_KERNEL=0`` turns it off (the
float32 math path again). Its values are the math path's up to float32 summation order (and an
exponential within 2 ulp of ``expf``): a half-precision step can part from one without it only
at a near-tie, the lossless rule of :mod:`tss_opt.decoding.lossless`.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from tss_opt.decoding.kernels import rows

log = logging.getLogger(__name__)

__all__ = ["available", "fits", "library", "short_attention", "unavailable_reason"]

SOURCE = Path(__file__).with_name("attention_bf16.c")
MAX_ROWS = 32
"""Query rows sharing a key-value head (grouped heads x query positions) the kernel takes."""
MAX_HEAD_DIM = 256


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here (``None`` where it can be built)."""
    if os.environ.get("TSS_ATTENTION_KERNEL", "1") == "0":
        return "TSS_ATTENTION_KERNEL=0"
    return rows.machine_reason()


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first call; ``None`` (said once, INFO) where it cannot run."""
    lib, reason = rows.load(SOURCE, unavailable_reason())
    if lib is None:
        log.info("half-precision attention of short steps in float32 math, not our attention kernel: %s", reason)
        return None
    fn = lib.tss_short_attention
    p, n = ctypes.c_void_p, ctypes.c_long
    fn.argtypes = [p, n, n, p, n, n, p, n, n, p, n, ctypes.c_int, p, n, n, n, n, n, ctypes.c_float]
    fn.restype = ctypes.c_int
    return lib


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel runs here (builds it on first call). A constant to ``torch.compile``:
    decided once per process, so a graph traced with the kernel keeps it."""
    return library() is not None


def fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the kernel takes these shapes: bfloat16 on the CPU, one sequence, head size a
    multiple of 32 (at most 256), keys and values of one shape, at most :data:`MAX_ROWS` query
    rows per key-value head, and a mask shared by the heads that covers the keys (or none).
    Strides are not compared (the kernel takes any): in a compiled graph that would tie the
    key and value buffers' dynamic lengths together."""
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    return (
        query.device.type == "cpu"
        and query.dtype == key.dtype == value.dtype == torch.bfloat16
        and b == key.shape[0] == 1
        and key.shape == value.shape
        and d % 32 == 0 and d <= MAX_HEAD_DIM and key.shape[3] == d
        and heads % kv_heads == 0 and heads // kv_heads * q <= MAX_ROWS
        and (mask is None or (mask.dim() == 4 and mask.shape[0] == 1 and mask.shape[1] == 1 and mask.shape[2] in (1, q)
                              and mask.shape[3] >= key.shape[2]))
    )


def short_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Attention of a few query positions (see :func:`fits`), through ``tss_opt::short_attention``.

    Args:
        query: ``(1, H, q, D)`` bfloat16.
        key, value: ``(1, H_kv, W, D)`` bfloat16, any strides between heads and positions (a
            window of a cache buffer); head ``h`` reads key-value head ``h // (H / H_kv)``.
        mask: additive (0 / a large negative; float32 or bfloat16, read in place; another
            dtype is copied to float32) or boolean (True: attend), ``(1, 1, q or 1, W')`` with
            ``W' >= W`` (its first ``W`` keys are used), or ``None`` (every key).
        scale: the scores' factor.

    Returns:
        ``(1, q, H, D)`` bfloat16 (transformers' attention output layout).
    """
    return torch.ops.tss_opt.short_attention(query, key, value, mask, scale)


_MASK_KINDS = {torch.float32: 1, torch.bfloat16: 2, torch.bool: 3}
"""The kernel's mask kinds (attention_bf16.c): it reads the mask in place, as passed."""


def _run(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The operator's CPU implementation: the kernel through ``ctypes`` (shapes as :func:`short_attention`)."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"attention kernel unavailable: {unavailable_reason() or 'its build failed (see the INFO log)'}")
    _, heads, q, d = query.shape
    kv_heads, w = key.shape[1], key.shape[2]
    if query.stride(3) != 1:
        query = query.contiguous()
    if key.stride(3) != 1 or value.stride(3) != 1:
        key, value = key.contiguous(), value.contiguous()
    kind, m_si = 0, 0
    if mask is not None:
        if mask.dtype not in _MASK_KINDS:  # float16, float64: additive, as float32
            mask = mask.float()
        if mask.stride(3) != 1:
            mask = mask.contiguous()
        kind, m_si = _MASK_KINDS[mask.dtype], mask.stride(2) if mask.shape[2] > 1 else 0
    out = torch.empty((1, q, heads, d), dtype=torch.bfloat16)
    rc = lib.tss_short_attention(
        query.data_ptr(), query.stride(1), query.stride(2), key.data_ptr(), key.stride(1), key.stride(2),
        value.data_ptr(), value.stride(1), value.stride(2), None if mask is None else mask.data_ptr(), m_si, kind,
        out.data_ptr(), heads, kv_heads, q, w, d, float(scale),
    )
    if rc != 0:  # fits() admits only shapes the kernel takes; this is a bug, not bad input
        raise RuntimeError(f"attention kernel rejected query {tuple(query.shape)}, keys {tuple(key.shape)}")
    return out


# Defined beside ``tss_opt::packed_linear`` (decoding/linear.py) in the same namespace.
_LIB = torch.library.Library("tss_opt", "FRAGMENT")
_LIB.define("short_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale) -> Tensor")
_LIB.impl("short_attention", _run, "CPU")


@torch.library.register_fake("tss_opt::short_attention", lib=_LIB)
def _short_attention_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    _, heads, q, d = query.shape
    return query.new_empty((1, q, heads, d))
