"""Our float32 rows kernel (tss_opt/decoding/kernels/rows_f32.py, rows_f32.c): built from source
here, F.linear's values to float32 rounding, row-invariant, chosen by pack_linears on one thread
only, never where a gradient is asked for, and speculative decoding through it emits plain
greedy decoding's tokens."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from test_linear import spy_packed_products, verify_and_decode  # tests/decoding

from tss_opt.config.model import TinyConfig
from tss_opt.decoding import linear
from tss_opt.decoding.cache import crop_to
from tss_opt.decoding.compiled import CompiledTarget
from tss_opt.decoding.drafters import PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.kernels import rows, rows_f32
from tss_opt.decoding.sizing import hardware_key
from tss_opt.decoding.sizing.latency import SCHEDULE_KEYS
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models.tiny import build_tiny_model

needs_kernel = pytest.mark.skipif(
    rows_f32.unavailable_reason() is not None, reason=f"the float32 rows kernel cannot run here: {rows_f32.unavailable_reason()}"
)


def f32(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tiny(num_layers: int = 3) -> torch.nn.Module:
    return build_tiny_model(TinyConfig(), num_layers=num_layers, seed=0, dtype=torch.float32).eval()


def test_a_cpu_without_the_instructions_keeps_f_linear_and_says_why(monkeypatch):
    monkeypatch.setattr(rows, "cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    assert rows_f32.unavailable_reason() == "the CPU lacks avx2, fma"
    monkeypatch.setattr(rows, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setenv("TSS_ROWS_KERNEL", "0")  # one switch for both rows kernels
    assert rows_f32.unavailable_reason() == "TSS_ROWS_KERNEL=0"


def test_weights_it_cannot_read_in_place_are_refused():
    assert rows_f32.fits(f32(7, 5))
    assert not rows_f32.fits(f32(8, 16).to(torch.bfloat16))
    assert not rows_f32.fits(f32(16, 8).t())  # columns contiguous, not rows
    assert not rows_f32.fits(f32(8))


@needs_kernel
def test_bad_inputs_name_what_was_expected():
    w = f32(24, 40)
    with pytest.raises(ValueError, match=r"input \(3, 41\).*expected float32 \(\.\.\., 40\)"):
        rows_f32.rows_linear_f32(f32(3, 41), w)
    with pytest.raises(ValueError, match=r"weight \(40, 24\).*contiguous rows"):
        rows_f32.rows_linear_f32(f32(3, 24), w.t())


@needs_kernel
def test_the_library_is_built_into_the_cache_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TSS_KERNEL_CACHE", str(tmp_path))
    path = rows._build(rows._compiler(), rows_f32.SOURCE, rows_f32.FLAGS)
    assert path.parent == tmp_path and path.name.startswith("rows_f32-") and path.suffix == ".so"
    mtime = path.stat().st_mtime_ns
    assert rows._build(rows._compiler(), rows_f32.SOURCE, rows_f32.FLAGS) == path
    assert path.stat().st_mtime_ns == mtime  # reused


@needs_kernel
@pytest.mark.parametrize(
    ("n", "k"),
    [(576, 576), (1536, 576), (576, 1536), (259, 64), (13, 37), (7, 5), (1, 8)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_computes_f_linear(n, k, bias):
    """Every row count 1-16 and one of 40 (rows past 16 in chunks), outputs not a multiple of a
    tile, inputs not a multiple of 8, with and without bias: F.linear's values to float32
    rounding, and at least as close to the float64 product as F.linear is."""
    w, b = f32(n, k, seed=1), (f32(n, seed=2) if bias else None)
    x = f32(40, k, seed=3)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    for m in [*range(1, 17), 40]:
        got = rows_f32.rows_linear_f32(x[:m], w, b)
        want = F.linear(x[:m], w, b)
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k**0.5)
        err_ours = (got.double() - exact[:m]).abs().max()
        err_mkl = (want.double() - exact[:m]).abs().max()
        assert err_ours <= 2 * err_mkl + 1e-6, (m, float(err_ours), float(err_mkl))


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_rows_share_its_call():
    """Row-invariance: the property that makes a token verified among 16 rows equal to the same
    token decoded alone, bit for bit (MKL's products change their kernel with the row count)."""
    w, b = f32(1536, 576, seed=4), f32(1536, seed=5)
    x = f32(16, 576, seed=6)
    alone = torch.cat([rows_f32.rows_linear_f32(x[i : i + 1], w, b) for i in range(16)])
    for m in range(1, 17):
        assert torch.equal(rows_f32.rows_linear_f32(x[:m], w, b), alone[:m]), m
    # Rows that are a strided view (a step's last positions) get the same bits as copies.
    wide = f32(16, 2 * 576, seed=6)[:, :576]
    assert torch.equal(rows_f32.rows_linear_f32(wide, w, b), rows_f32.rows_linear_f32(wide.contiguous(), w, b))


@needs_kernel
@pytest.mark.parametrize("other", sorted(set(rows.SCHEDULES) - {"earlier"}))
def test_no_schedule_changes_a_bit(monkeypatch, other):
    """rows.SCHEDULE (chosen per CPU; TSS_ROWS_STREAM=0 restores the earlier schedule) changes
    the order the weights are read in (1-2 rows one output at a time in ``blocks`` and ``ahead``,
    two of them prefetching two outputs ahead in ``ahead``, a prefetch of the next group of six
    in the others), not a sum: every row count, with and without a bias, gets the same bits in
    each. 1543 outputs: groups of six and a remainder, so the last groups and outputs prefetch
    nothing."""
    w, b = f32(1543, 576, seed=7), f32(1543, seed=8)
    x = f32(16, 576, seed=9)
    monkeypatch.setattr(rows, "SCHEDULE", "earlier")
    before = {(m, bias is None): rows_f32.rows_linear_f32(x[:m], w, bias) for m in range(1, 17) for bias in (None, b)}
    monkeypatch.setattr(rows, "SCHEDULE", other)
    for (m, no_bias), got in before.items():
        assert torch.equal(got, rows_f32.rows_linear_f32(x[:m], w, None if no_bias else b)), m


@needs_kernel
def test_latency_tables_of_another_schedule_have_their_own_key(monkeypatch, one_thread):
    """A table measured in one schedule must not size a process in another (tables from before
    the schedules carried " rows" alone, the earlier schedule's key)."""
    target = TargetModel(tiny())
    keys = {}
    for name in rows.SCHEDULES:
        monkeypatch.setattr(rows, "SCHEDULE", name)
        keys[name] = hardware_key(target)["model"]
    assert keys["earlier"].endswith(" rows") and keys["blocks"].endswith(" rows+stream")
    assert keys["prefetch"].endswith(" rows+prefetch") and keys["ahead"].endswith(" rows+ahead")


@needs_kernel
def test_on_one_thread_a_float32_target_uses_the_kernel_in_place(monkeypatch, caplog, one_thread):
    model = tiny()
    with caplog.at_level(logging.INFO, logger="tss_opt.decoding.linear"):
        target = TargetModel(model)
    assert linear.packed_kernel(model) == "rows"
    assert "float32 step products through our float32 rows kernel" in caplog.text
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # In place: the layer's own storage, no copy (and no buffer: exports never see it).
    assert all(m._tss_packed_weight.data_ptr() == m.weight.data_ptr() for m in layers)
    assert "_tss_packed_weight" not in "".join(model.state_dict())
    # float32 tables of F.linear never size it
    assert hardware_key(target)["model"].endswith(f" rows{SCHEDULE_KEYS[rows.SCHEDULE]}")
    calls = spy_packed_products(monkeypatch)
    packed = verify_and_decode(target)
    assert calls and all(shape.numel() <= linear.PACK_MAX_ROWS * shape[-1] for shape in calls)
    monkeypatch.setattr(linear, "PACK_MAX_ROWS", 0)  # F.linear everywhere
    plain = verify_and_decode(target)
    torch.testing.assert_close(packed[0], plain[0], rtol=1e-5, atol=1e-5)
    assert packed[1] == plain[1]


@needs_kernel
def test_speculative_decoding_through_the_kernel_emits_plain_greedy_tokens(one_thread):
    """The standard: greedy speculative decoding emits exactly plain greedy decoding's tokens of
    the same target (dense and under a skip set), both through the kernel."""
    target = TargetModel(tiny(num_layers=4))
    assert linear.packed_kernel(target.model) == "rows"
    prompt = torch.tensor([5, 9, 11, 3, 7, 2, 8, 13, 4, 6, 5, 9, 11, 3, 7])
    for skip in [(), (1, 2)]:
        plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=24, skip=skip).tokens.tolist()
        spec = SpeculativeEngine(target, PromptLookupDrafter(num_tokens=6)).generate(prompt, max_new_tokens=24, skip=skip)
        assert spec.tokens.tolist() == plain, skip


def test_two_threads_keep_f_linear():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = tiny(num_layers=2)
        assert linear.pack_linears(model) == 0
    finally:
        torch.set_num_threads(before)
    assert linear.packed_kernel(model) is None


@needs_kernel
def test_a_forward_that_trains_keeps_f_linear(one_thread):
    """The kernel has no backward: with a gradient asked for, the layer runs F.linear even inside
    our steps' context, and the gradient flows."""
    layer = torch.nn.Linear(24, 40)
    assert linear.pack_linears(layer) == 1
    x = f32(3, 24, seed=8).requires_grad_()
    with linear.packed_linears():
        y = layer(x)
    assert y.grad_fn is not None
    y.sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    with torch.no_grad(), linear.packed_linears():
        z = layer(x)
    assert z.grad_fn is None
    torch.testing.assert_close(z, y.detach(), rtol=1e-5, atol=1e-6)


@needs_kernel
def test_a_compiled_verification_runs_the_kernel_and_decodes_as_eager(monkeypatch, one_thread):
    """Inside the compiled graphs a step of 2-16 slots takes the kernel (through the
    tss_opt::packed_linear operator); a plain step keeps inductor's one-row product and fused
    head, which were as fast (benchmarks/rows_kernel.py --dtype float32). Greedy tokens equal
    the eager target's."""
    prompt = torch.tensor([5, 9, 11, 3, 7, 2, 8, 13, 4, 6])
    model = tiny()
    target = CompiledTarget(model)
    calls = spy_packed_products(monkeypatch)
    cache = target.new_cache()
    logits, _ = target.prefill(prompt, cache)
    tree = DraftTree(tokens=torch.tensor([3, 4, 5, 6]), parents=(-1, 0, 0, 2))
    calls.clear()
    target.verify_forward(int(logits[-1].argmax()), tree, cache, len(prompt))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert len(calls) == linears  # every layer's products in the graph, and the eager head
    calls.clear()
    crop_to(cache, len(prompt))
    target.verify_forward(int(logits[-1].argmax()), DraftTree.empty(), cache, len(prompt))
    assert calls == []
    eager = TargetModel(model)
    drafter = PromptLookupDrafter(num_tokens=6)
    tokens = SpeculativeEngine(eager).generate(prompt, max_new_tokens=16).tokens.tolist()
    assert SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=16).tokens.tolist() == tokens
