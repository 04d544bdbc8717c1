"""Our attention kernel for a step's few query positions (tss_opt/decoding/kernels/attention.py,
attention_bf16.c): the float32 math path's values from the bfloat16 window read once, masked
keys weighing nothing, each position independent of its step's others, and the same bits
inside a compiled graph."""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding import attention
from tss_opt.decoding.kernels import attention as kernel
from tss_opt.decoding.kernels import rows

needs_kernel = pytest.mark.skipif(kernel.unavailable_reason() is not None, reason=f"the attention kernel cannot run here: {kernel.unavailable_reason()}")


def window(heads: int, kv_heads: int, q: int, w: int, d: int, seed: int = 0, room: int = 7):
    """Query ``(1, H, q, D)`` and keys / values as the compiled step passes them: the first
    ``w`` positions of larger cache buffers (strided views), bfloat16."""
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    k, v = mk(1, kv_heads, w + room, d), mk(1, kv_heads, w + room, d)
    return mk(1, heads, q, d), k[:, :, :w], v[:, :, :w]


def math_path(query, key, value, mask, scale):
    """The float32 math path the kernel replaces (short_query_attention without the kernel)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel, "available", lambda: False)
        return attention.short_query_attention(query, key, value, mask, scale)


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=torch.bfloat16).masked_fill(~allowed, torch.finfo(torch.bfloat16).min)


def test_off_by_the_switch_or_without_the_instructions(monkeypatch):
    monkeypatch.setenv("TSS_ATTENTION_KERNEL", "0")
    assert kernel.unavailable_reason() == "TSS_ATTENTION_KERNEL=0"
    monkeypatch.delenv("TSS_ATTENTION_KERNEL")
    monkeypatch.setattr(rows, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert kernel.unavailable_reason() == "the CPU lacks avx512bw, avx512vl, avx512_bf16"


def test_shapes_it_does_not_take_keep_the_math_path():
    q, k, v = window(6, 2, 1, 20, 64)
    assert kernel.fits(q, k, v, None)
    assert not kernel.fits(*window(6, 2, 1, 20, 48), None)  # head size not 32, 64, 128 or 256
    assert not kernel.fits(q.float(), k.float(), v.float(), None)
    assert not kernel.fits(q, k, v, additive(torch.ones(1, 6, 1, 20, dtype=torch.bool)))  # a mask per head
    assert not kernel.fits(q, k, v, additive(torch.ones(1, 1, 1, 19, dtype=torch.bool)))  # narrower than the keys
    assert not kernel.fits(*window(33, 1, 1, 20, 64), None)  # 33 query rows share a key-value head
    two = torch.cat([q, q])
    assert not kernel.fits(two, torch.cat([k, k]), torch.cat([v, v]), None)  # two sequences


@needs_kernel
@pytest.mark.parametrize("d", [32, 64, 128, 256])
@pytest.mark.parametrize("q", [1, 2, 4])
@pytest.mark.parametrize("w", [1, 15, 16, 17, 300])
def test_the_kernel_gives_the_math_paths_values(d, q, w):
    """Within bfloat16's last place of the float32 math path, for every head size, each pass
    over the value rows (3 grouped heads x 1-4 positions), and windows that end inside a block
    of 16 keys; the mask is wider than the window (its first ``w`` keys count)."""
    query, key, value = window(9, 3, q, w, d, seed=d + q + w)
    allowed = torch.rand(1, 1, q, w + 5, generator=torch.Generator().manual_seed(w)) > 0.3
    allowed[..., 0] = True
    wide = torch.zeros(1, 1, q, 2 * (w + 5), dtype=torch.bool)
    wide[..., ::2] = allowed  # a boolean mask whose keys are not adjacent: copied, still boolean
    masks = (additive(allowed), additive(allowed).float(), allowed, additive(allowed)[:, :, :1], wide[..., ::2],
             None if q == 1 else allowed)
    for mask in masks:  # bfloat16, float32 and boolean, per position or one row for all
        got = kernel.short_attention(query, key, value, mask, d**-0.5)
        want = math_path(query, key, value, mask, d**-0.5)
        assert got.shape == want.shape == (1, q, 9, d) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-9)
    # the grouping: query head h reads key-value head h // 3 (flipped heads are a clear difference)
    swapped = kernel.short_attention(query, key.flip(1), value.flip(1), None if q == 1 else additive(allowed), d**-0.5)
    assert (swapped.float() - got.float()).abs().max() > 1e-2


@needs_kernel
def test_masked_keys_weigh_nothing_and_a_mask_row_serves_every_position():
    query, key, value = window(9, 3, 3, 40, 64)
    allowed = torch.ones(1, 1, 1, 40, dtype=torch.bool)
    allowed[..., 30:] = False
    loud = value.clone()
    loud[:, :, 30:] = 1e4  # what a masked key would add if it weighed anything
    got = kernel.short_attention(query, key, loud, additive(allowed), 0.125)
    want = kernel.short_attention(query, key[:, :, :30], value[:, :, :30], None, 0.125)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-9)


@needs_kernel
def test_a_position_gets_the_same_bits_whatever_else_its_step_holds():
    """Row-invariant, as the rows kernel: position 2 of a 4-position step equals that position
    verified alone (each query row is its own float32 sums, in one order)."""
    query, key, value = window(9, 3, 4, 257, 64)
    allowed = torch.rand(1, 1, 4, 257, generator=torch.Generator().manual_seed(3)) > 0.2
    allowed[..., 0] = True
    mask = additive(allowed)
    four = kernel.short_attention(query, key, value, mask, 0.125)
    one = kernel.short_attention(query[:, :, 2:3], key, value, mask[:, :, 2:3], 0.125)
    assert torch.equal(four[:, 2:3], one)


@needs_kernel
def test_short_query_attention_takes_it_and_a_compiled_graph_gives_the_same_bits():
    query, key, value = window(9, 3, 1, 200, 64, room=300)
    mask = additive(torch.ones(1, 1, 1, 256, dtype=torch.bool))
    eager = attention.short_query_attention(query, key, value, mask)
    assert torch.equal(eager, kernel.short_attention(query, key, value, mask, 64**-0.5))
    compiled = torch.compile(attention.short_query_attention, fullgraph=True, dynamic=False)
    torch._dynamo.maybe_mark_dynamic(key, 2)
    torch._dynamo.maybe_mark_dynamic(value, 2)
    assert torch.equal(compiled(query, key, value, mask), eager)
