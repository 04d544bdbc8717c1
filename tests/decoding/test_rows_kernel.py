"""Our bfloat16 rows kernel (tss_opt/decoding/kernels/rows.py, rows_bf16.c): built from source
here, the values of F.linear, row-invariant, and chosen by pack_linears on one thread only."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from test_linear import verify_and_decode  # tests/decoding: the packed-vs-F.linear run

from tss_opt.config.model import TinyConfig
from tss_opt.decoding import linear
from tss_opt.decoding.compiled import CompiledTarget
from tss_opt.decoding.kernels import rows
from tss_opt.decoding.sizing import hardware_key
from tss_opt.decoding.target import TargetModel
from tss_opt.models.tiny import build_tiny_model

needs_kernel = pytest.mark.skipif(
    rows.unavailable_reason() is not None or not linear.packing_supported(torch.device("cpu"), torch.bfloat16),
    reason=f"the rows kernel cannot run here: {rows.unavailable_reason()}",
)


def bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_a_cpu_without_the_instructions_keeps_onednn_and_says_why(monkeypatch):
    monkeypatch.setattr(rows, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert rows.unavailable_reason() == "the CPU lacks avx512bw, avx512vl, avx512_bf16"
    monkeypatch.setenv("TSS_ROWS_KERNEL", "0")
    assert rows.unavailable_reason() == "TSS_ROWS_KERNEL=0"


def test_shapes_the_layout_cannot_hold_are_refused_with_the_fix():
    assert not rows.fits(bf16(200, 96))  # 200 outputs: not a multiple of 16
    assert not rows.fits(bf16(208, 95))  # odd inputs
    assert not rows.fits(torch.randn(208, 96))  # float32
    with pytest.raises(ValueError, match=r"\(200, 96\).*multiple of 16"):
        rows.pack(bf16(200, 96))


def test_the_layout_holds_each_block_of_16_outputs_as_pairs_of_inputs():
    w = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4).to(torch.bfloat16)
    p = rows.pack(w)
    assert p.shape == (2, 2, 16, 2) and p.is_contiguous()
    # block 1, pair 1, output 3 of the block: w[16 + 3, 2:4]
    assert p[1, 1, 3].tolist() == w[19, 2:4].tolist()


@needs_kernel
def test_the_library_is_built_into_the_cache_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TSS_KERNEL_CACHE", str(tmp_path))
    path = rows._build(rows._compiler())
    assert path.parent == tmp_path and path.suffix == ".so"
    mtime = path.stat().st_mtime_ns
    assert rows._build(rows._compiler()) == path and path.stat().st_mtime_ns == mtime  # reused
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@needs_kernel
@pytest.mark.parametrize("rows_n", [1, 2, 5, 6, 7, 8, 9, 16, 17, 40])
def test_the_kernel_computes_f_linear(rows_n):
    """Within bfloat16's last place of F.linear at every row count (every tile shape and the
    chunking of the rows past 6 and 8), with and without a bias; 13 outputs blocks so the
    groups of 3 and 4 blocks both leave a remainder."""
    w, b = bf16(13 * 16, 96, seed=1), bf16(13 * 16, seed=2)
    x = bf16(2, rows_n, 96, seed=3)
    p = rows.pack(w)
    for bias in (None, b):
        got, want = rows.rows_linear(x, p, bias), F.linear(x, w, bias)
        assert got.shape == want.shape == (2, rows_n, 13 * 16) and got.dtype == torch.bfloat16
        exact = (x.double() @ w.double().T + (0 if bias is None else bias.double()))
        # both round one float32 sum to bfloat16: at most one bf16 place apart, and as close to the exact sum
        assert torch.allclose(got.double(), want.double(), rtol=2 ** -7, atol=1e-3)
        assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max() * 1.5 + 1e-3


@needs_kernel
def test_one_row_equals_onednns_one_row_product_bit_for_bit():
    w, x = bf16(1536, 576, seed=4), bf16(1, 576, seed=5)
    onednn = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 1), None, "none", [], "")
    assert torch.equal(rows.rows_linear(x, rows.pack(w)), onednn)


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_rows_share_its_call():
    """Row-invariance: the point of the kernel's one accumulator per output (a token verified
    among 16 gets the bits it gets alone), which oneDNN's products do not promise."""
    w = bf16(49 * 16, 576, seed=6)
    p = rows.pack(w)
    x = bf16(16, 576, seed=7)
    alone = torch.cat([rows.rows_linear(x[i : i + 1], p) for i in range(16)])
    for m in range(1, 17):
        assert torch.equal(rows.rows_linear(x[:m], p), alone[:m]), m


def tiny() -> torch.nn.Module:
    return build_tiny_model(TinyConfig(), num_layers=3, seed=0, dtype=torch.bfloat16).eval()


@needs_kernel
def test_on_one_thread_the_target_packs_for_the_rows_kernel_and_decodes_as_f_linear(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="tss_opt.decoding.linear"):
        target = TargetModel(tiny())
    assert linear.packed_kernel(target.model) == "rows"
    assert "layers for rows" in caplog.text
    key = hardware_key(target)["model"]
    assert key.endswith(" rows") and " packed" not in key
    assert hardware_key(CompiledTarget(target.model))["model"].endswith(" compiled padded rows+graph")
    packed = verify_and_decode(target)
    monkeypatch.setattr(linear, "PACK_MAX_ROWS", 0)  # F.linear everywhere
    plain = verify_and_decode(target)
    assert torch.allclose(packed[0].float(), plain[0].float(), rtol=2**-6, atol=0.05)
    assert packed[1] == plain[1]


@needs_kernel
def test_on_two_threads_onednn_keeps_the_products():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = tiny()
        linear.pack_linears(model)
    finally:
        torch.set_num_threads(before)
    assert linear.packed_kernel(model) == "onednn"
    assert hardware_key(TargetModel(model))["model"].endswith(" packed")


def test_nothing_packed_has_no_kernel():
    model = build_tiny_model(TinyConfig(), num_layers=2, seed=0, dtype=torch.float64)
    linear.pack_linears(model)
    assert linear.packed_kernel(model) is None
