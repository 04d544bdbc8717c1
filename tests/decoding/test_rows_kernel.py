"""Our bfloat16 rows kernel (tss_opt/decoding/kernels/rows.py, rows_bf16.c): built from source
here, the values of F.linear, row-invariant, and chosen by pack_linears on one thread only."""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn.functional as F
from test_linear import verify_and_decode  # tests/decoding: the packed-vs-F.linear run

from tss_opt.config.model import TinyConfig
from tss_opt.decoding import linear
from tss_opt.decoding.cache import crop_to
from tss_opt.decoding.compiled import CompiledTarget
from tss_opt.decoding.kernels import rows
from tss_opt.decoding.sizing import hardware_key
from tss_opt.decoding.sizing.latency import SCHEDULE_KEYS
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models.precision import cpu_flags, cpu_vendor
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
    """Where oneDNN computes with AVX-512 BF16 (the EPYCs) its one-row product sums as the
    kernel does; on AMX tiles it sums in another order, so there within the last place."""
    w, x = bf16(1536, 576, seed=4), bf16(1, 576, seed=5)
    onednn = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 1), None, "none", [], "")
    ours = rows.rows_linear(x, rows.pack(w))
    if linear.AMX_FLAG in rows.cpu_flags():
        assert torch.allclose(ours.double(), onednn.double(), rtol=2**-7, atol=1e-3)
    else:
        assert torch.equal(ours, onednn)


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


@needs_kernel
@pytest.mark.parametrize("other", sorted(set(rows.SCHEDULES) - {"earlier"}))
def test_no_schedule_changes_a_bit(monkeypatch, other):
    """rows.SCHEDULE (chosen per CPU; TSS_ROWS_STREAM=0 restores the earlier schedule) changes
    the order the weights are read in (1-4 rows one block at a time in ``blocks``, a prefetch of
    the next group in ``blocks`` and ``prefetch``), not a sum: every row count, with and without
    a bias, gets the same bits in each. 49 blocks: groups of 3 and 4 with a remainder, so the
    last groups prefetch nothing."""
    w, b = bf16(49 * 16, 576, seed=8), bf16(49 * 16, seed=9)
    p, x = rows.pack(w), bf16(16, 576, seed=10)
    monkeypatch.setattr(rows, "SCHEDULE", "earlier")
    before = {(m, bias is None): rows.rows_linear(x[:m], p, bias) for m in range(1, 17) for bias in (None, b)}
    monkeypatch.setattr(rows, "SCHEDULE", other)
    for (m, no_bias), got in before.items():
        assert torch.equal(got, rows.rows_linear(x[:m], p, None if no_bias else b)), m


def test_the_schedule_is_chosen_by_the_cpus_vendor_and_the_switch(tmp_path):
    """``blocks`` on AMD with AVX-512, ``ahead`` on AMD without, ``prefetch`` elsewhere (each
    measured fastest on a Zen 4, a Zen 3 and an Intel Xeon); TSS_ROWS_STREAM names one (0 and 1:
    its spellings before there were several), and a value it does not know is an error that
    names it."""
    zen3, zen4, intel = tmp_path / "zen3", tmp_path / "zen4", tmp_path / "intel"
    zen3.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fma avx2\n")
    zen4.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: avx2 avx512f avx512_bf16\n")
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: avx2 avx512f\n")
    assert (cpu_vendor(zen3), cpu_vendor(intel), cpu_vendor(tmp_path / "none")) == ("AuthenticAMD", "GenuineIntel", "")
    assert rows.default_schedule(cpu_vendor(zen4), cpu_flags(zen4)) == "blocks"
    assert rows.default_schedule(cpu_vendor(zen3), cpu_flags(zen3)) == "ahead"
    assert rows.default_schedule(cpu_vendor(intel), cpu_flags(intel)) == "prefetch"
    assert rows.default_schedule("", frozenset()) == "prefetch"
    for value in (None, "", "1", "auto", " auto "):
        assert rows.schedule_from(value, "AuthenticAMD", cpu_flags(zen4)) == "blocks", value
        assert rows.schedule_from(value, "AuthenticAMD", cpu_flags(zen3)) == "ahead", value
        assert rows.schedule_from(value, "GenuineIntel", cpu_flags(intel)) == "prefetch", value
    assert rows.schedule_from("0", "AuthenticAMD", cpu_flags(zen4)) == "earlier"
    assert rows.schedule_from("earlier", "GenuineIntel", cpu_flags(intel)) == "earlier"
    assert rows.schedule_from("prefetch", "AuthenticAMD", cpu_flags(zen3)) == "prefetch"
    assert rows.schedule_from("blocks", "GenuineIntel", cpu_flags(intel)) == "blocks"
    assert rows.schedule_from("ahead", "GenuineIntel", cpu_flags(intel)) == "ahead"
    with pytest.raises(ValueError, match=r"TSS_ROWS_STREAM='fast'.*blocks, prefetch or ahead"):
        rows.schedule_from("fast", "GenuineIntel", cpu_flags(intel))
    assert rows.SCHEDULE == rows.schedule_from(os.environ.get("TSS_ROWS_STREAM"), cpu_vendor(), cpu_flags())


def tiny() -> torch.nn.Module:
    return build_tiny_model(TinyConfig(), num_layers=3, seed=0, dtype=torch.bfloat16).eval()


@needs_kernel
def test_on_one_thread_the_target_packs_for_the_rows_kernel_and_decodes_as_f_linear(monkeypatch, caplog):
    monkeypatch.setenv("TSS_AMX_ROWS", "0")  # the rows kernel alone, AMX or not (the AMX tests below)
    with caplog.at_level(logging.INFO, logger="tss_opt.decoding.linear"):
        target = TargetModel(tiny())
    assert linear.packed_kernel(target.model) == "rows"
    assert "layers for rows" in caplog.text
    key = hardware_key(target)["model"]
    suffix = SCHEDULE_KEYS[rows.SCHEDULE]  # "+stream" (blocks) or "+prefetch"
    assert suffix and key.endswith(f" rows{suffix}") and " packed" not in key
    assert hardware_key(CompiledTarget(target.model))["model"].endswith(f" compiled padded rows{suffix}+graph")
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


def test_oneDNNs_amx_product_is_chosen_by_the_cpu_flag_and_the_switch(monkeypatch):
    monkeypatch.setattr(linear, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert linear.amx_reason() == "the CPU lacks amx_bf16"
    monkeypatch.setattr(linear, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
    assert linear.amx_reason() is None
    monkeypatch.setenv("TSS_AMX_ROWS", "0")
    assert linear.amx_reason() == "TSS_AMX_ROWS=0"


@pytest.fixture
def amx(monkeypatch) -> None:
    """A CPU with AMX as pack_linears sees it (the choice is tested on any CPU whose oneDNN
    computes bfloat16; AMX only makes oneDNN's wide products fast)."""
    monkeypatch.delenv("TSS_AMX_ROWS", raising=False)
    monkeypatch.setattr(linear, "cpu_flags", lambda: rows.cpu_flags() | {"amx_bf16", "amx_tile"})


def _chain(n: int) -> DraftTree:
    return DraftTree(tokens=torch.arange(3, 3 + n), parents=tuple(range(-1, n - 1)))


@needs_kernel
def test_where_onednn_has_amx_the_wider_products_take_its_copy(amx, monkeypatch, caplog):
    """Our kernel up to amx_from_rows() - 1 rows, oneDNN's prepacked product (AMX) from there up
    to PACK_MAX_ROWS, F.linear beyond: the values of each (bit for bit), and a key of its own.
    9 rows while the kernel prefetches (the shipped schedules), 7 in the earlier one."""
    shipped = rows.SCHEDULE
    for name in ("blocks", "prefetch"):
        monkeypatch.setattr(rows, "SCHEDULE", name)
        assert linear.amx_from_rows() == linear.AMX_FROM_ROWS == 9
    monkeypatch.setattr(rows, "SCHEDULE", "earlier")
    assert linear.amx_from_rows() == linear.AMX_FROM_ROWS_EARLIER == 7
    monkeypatch.setattr(rows, "SCHEDULE", shipped)
    with caplog.at_level(logging.INFO, logger="tss_opt.decoding.linear"):
        target = TargetModel(tiny())
    assert linear.packed_kernel(target.model) == "rows+amx"
    assert f"oneDNN's AMX product from {linear.amx_from_rows()} rows" in caplog.text
    suffix = SCHEDULE_KEYS[rows.SCHEDULE]
    assert hardware_key(target)["model"].endswith(f" rows+amx{suffix}")
    assert hardware_key(CompiledTarget(target.model))["model"].endswith(f" compiled padded rows+amx{suffix}+graph")
    layer = target.model.model.layers[0].mlp.up_proj
    x = bf16(2 * linear.PACK_MAX_ROWS, layer.in_features, seed=8)
    onednn = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), 1)
    taken: list[int] = []
    real = rows.rows_linear
    monkeypatch.setattr(rows, "rows_linear", lambda x, p, b=None: taken.append(x.shape[0]) or real(x, p, b))
    with linear.packed_linears(), torch.no_grad():  # as our steps run (a forward that trains keeps F.linear)
        for n in (1, linear.amx_from_rows() - 1, linear.amx_from_rows(), linear.PACK_MAX_ROWS, linear.PACK_MAX_ROWS + 1):
            got = layer(x[:n])
            if n < linear.amx_from_rows():
                assert torch.equal(got, real(x[:n], rows.pack(layer.weight)))
            elif n <= linear.PACK_MAX_ROWS:
                assert torch.equal(got, torch.ops.mkldnn._linear_pointwise(x[:n], onednn, layer.bias, "none", [], ""))
            else:
                assert torch.equal(got, F.linear(x[:n], layer.weight, layer.bias))
    assert taken == [1, linear.amx_from_rows() - 1]
    # A whole target: tokens as with F.linear, and a verification of amx_from_rows() slots within
    # rounding.
    packed = verify_and_decode(target)
    cache = target.new_cache()
    prompt = torch.tensor([5, 9, 11, 3, 7, 2, 8, 13, 4, 6])
    target.prefill(prompt, cache)
    wide, _ = target.verify_forward(4, _chain(linear.amx_from_rows() - 1), cache, len(prompt))
    monkeypatch.setattr(linear, "PACK_MAX_ROWS", 0)  # F.linear everywhere
    plain = verify_and_decode(target)
    crop_to(cache, len(prompt))
    wide_plain, _ = target.verify_forward(4, _chain(linear.amx_from_rows() - 1), cache, len(prompt))
    assert packed[1] == plain[1]
    assert torch.allclose(wide.float(), wide_plain.float(), rtol=2**-6, atol=0.05)


@needs_kernel
def test_inside_a_compiled_graph_a_step_of_sixteen_slots_takes_onednns_copy(amx, monkeypatch):
    """The row count is static in a graph: a bucket of 16 slots calls the operator on oneDNN's
    copy, one of 8 (below amx_from_rows()) on the rows kernel's layout, and a plain step neither
    (inductor's one row)."""
    target = CompiledTarget(TargetModel(tiny()).model)
    layouts: list[str] = []
    real = linear._packed_product
    monkeypatch.setattr(linear, "_packed_product",
                        lambda x, p, b: layouts.append("rows" if p.dim() == 4 else "onednn") or real(x, p, b))
    prompt = torch.tensor([5, 9, 11, 3, 7, 2, 8, 13, 4, 6])
    cache = target.new_cache()
    target.prefill(prompt, cache)
    linears = sum(isinstance(m, torch.nn.Linear) for m in target.model.modules())
    seen = {}
    for drafted in (10, 6, 0):  # 11 slots (bucket 16), 7 (bucket 8), a plain step
        layouts.clear()
        crop_to(cache, len(prompt))
        target.verify_forward(4, _chain(drafted) if drafted else DraftTree.empty(), cache, len(prompt))
        seen[drafted] = list(layouts)
    # Every decoder layer's products in the graph, then the head, eagerly (the tiny model's
    # vocabulary is no multiple of 16: oneDNN's copy alone, whatever the rows).
    assert seen[10] == ["onednn"] * linears
    assert seen[6] == ["rows"] * (linears - 1) + ["onednn"]
    assert seen[0] == []  # a plain step: inductor's one-row products, the head in its graph too
