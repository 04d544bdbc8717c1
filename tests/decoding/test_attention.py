"""The verification attention: SDPA as transformers calls it, or, for a step's few positions in
half precision on a CPU, the same attention in float32 math (tss_opt/decoding/attention.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tss_opt.decoding.attention import (
    ATTENTION_NAME,
    SHORT_QUERY,
    attend,
    short_query_attention,
    verify_attention,
)


def qkv(q: int, w: int, dtype: torch.dtype, heads: int = 6, kv_heads: int = 2, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    return mk(1, heads, q, d), mk(1, kv_heads, w, d), mk(1, kv_heads, w, d)


def reference(query, key, value, mask):
    """SDPA in float64 with the key-value heads repeated (transformers' repeat_kv)."""
    groups = query.shape[1] // key.shape[1]
    k, v = (t.double().repeat_interleave(groups, dim=1) for t in (key, value))
    m = mask[..., : key.shape[2]]
    m = m if m.dtype == torch.bool else m.double()
    return F.scaled_dot_product_attention(query.double(), k, v, attn_mask=m).transpose(1, 2)


def attention_module() -> torch.nn.Module:
    """What transformers' SDPA reads off an attention layer: its grouped heads (6 / 2)."""
    module = torch.nn.Module()
    module.num_key_value_groups = 3
    module.is_causal = True
    return module


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize("q", [1, 3])
@pytest.mark.parametrize("kind", ["additive", "bool", "per_head"])
def test_short_query_attention_is_sdpa_with_grouped_heads(q, kind):
    query, key, value = qkv(q, 40, torch.float32)
    allowed = torch.rand(1, 1, q, 48, generator=torch.Generator().manual_seed(1)) > 0.3
    allowed[..., 0] = True  # every row sees something
    if kind == "per_head":  # a mask per query head; each head keeps its own
        allowed = torch.rand(1, 6, q, 48, generator=torch.Generator().manual_seed(2)) > 0.3
        allowed[..., 0] = True
    mask = allowed if kind == "bool" else additive(allowed, torch.float32)
    got = short_query_attention(query, key, value, mask)  # the mask is wider than the keys: its first 40 used
    assert got.shape == (1, q, 6, 16) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(query, key, value, mask), rtol=1e-5, atol=1e-6)
    # a wrong head grouping (head h reading key-value head h % 2) is a clear difference
    swapped = short_query_attention(query, key.flip(1), value.flip(1), mask)
    assert (swapped - got).abs().max() > 1e-2


def test_half_precision_short_query_is_as_accurate_as_sdpa():
    query, key, value = qkv(1, 900, torch.bfloat16)
    mask = additive(torch.ones(1, 1, 1, 900, dtype=torch.bool), torch.bfloat16)
    want = reference(query, key, value, mask)
    ours = (short_query_attention(query, key, value, mask).double() - want).abs().max()
    sdpa = (sdpa_attention_forward(attention_module(), query, key, value, mask)[0].double() - want).abs().max()
    assert ours <= 2 * sdpa + 1e-3, (ours, sdpa)


def test_attend_keeps_sdpa_exactly_in_full_precision_and_for_long_queries():
    module = attention_module()
    for dtype, q in ((torch.float32, 1), (torch.float64, 2), (torch.bfloat16, SHORT_QUERY + 1)):
        query, key, value = qkv(q, 24, dtype)
        mask = additive(torch.ones(1, 1, q, 24, dtype=torch.bool).tril(24 - q), dtype)
        got, _ = attend(module, query, key, value, mask)
        want, _ = sdpa_attention_forward(module, query, key, value, mask)
        assert torch.equal(got, want), (dtype, q)


def test_attend_takes_the_math_path_for_a_short_half_precision_query():
    module = attention_module()
    for q in (1, SHORT_QUERY):
        query, key, value = qkv(q, 300, torch.bfloat16)
        mask = additive(torch.ones(1, 1, q, 300, dtype=torch.bool), torch.bfloat16)
        got, _ = attend(module, query, key, value, mask)
        assert torch.equal(got, short_query_attention(query, key, value, mask))
    # no mask and more than one position: causal by SDPA's rule, which the math path does not apply
    query, key, value = qkv(2, 2, torch.bfloat16)
    got, _ = attend(module, query, key, value, None)
    assert torch.equal(got, sdpa_attention_forward(module, query, key, value, None)[0])


def test_verify_attention_selects_and_always_restores(tiny):
    tiny_model = tiny.model
    config = tiny_model.config
    assert config._attn_implementation == "sdpa"
    with verify_attention(tiny_model):
        assert config._attn_implementation == ATTENTION_NAME
    assert config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), verify_attention(tiny_model):
        raise RuntimeError("a forward failed")
    assert config._attn_implementation == "sdpa"
    config._attn_implementation = "eager"  # another implementation is the user's choice: left alone
    try:
        with verify_attention(tiny_model):
            assert config._attn_implementation == "eager"
    finally:
        config._attn_implementation = "sdpa"
