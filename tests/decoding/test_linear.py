"""Prepacked linear layers (tss_opt/decoding/linear.py): bfloat16 on a CPU, our forwards only,
the same outputs as ``F.linear`` where they apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tss_opt.config.model import TinyConfig
from tss_opt.decoding import linear
from tss_opt.decoding.cache import crop_to
from tss_opt.decoding.compiled import CompiledTarget
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.kernels import rows
from tss_opt.decoding.linear import (
    PACK_MAX_ROWS,
    is_packed,
    pack_linears,
    packed_linears,
    packing_supported,
)
from tss_opt.decoding.sizing import hardware_key
from tss_opt.decoding.sizing.latency import SCHEDULE_KEYS
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models.tiny import build_tiny_model

CPU = torch.device("cpu")
needs_bf16 = pytest.mark.skipif(
    not packing_supported(CPU, torch.bfloat16), reason="this CPU's oneDNN has no bfloat16 products to prepack for"
)


def tiny(dtype: torch.dtype) -> torch.nn.Module:
    return build_tiny_model(TinyConfig(), num_layers=3, seed=0, dtype=dtype).eval()


def test_only_bfloat16_on_a_cpu_is_packed_for_onednn(monkeypatch):
    assert not packing_supported(CPU, torch.float32)
    assert not packing_supported(CPU, torch.float64)
    assert not packing_supported(torch.device("meta"), torch.bfloat16)
    model = tiny(torch.float64)
    assert pack_linears(model) == 0
    assert all(not hasattr(m, "_tss_packed_weight") for m in model.modules())
    # float32 goes to our float32 rows kernel only (test_rows_f32_kernel.py); with the kernels
    # switched off it is left alone too.
    monkeypatch.setenv("TSS_ROWS_KERNEL", "0")
    monkeypatch.setattr(linear.rows_f32, "library", linear.rows_f32.library.__wrapped__)
    model = tiny(torch.float32)
    assert pack_linears(model) == 0
    assert all(not hasattr(m, "_tss_packed_weight") for m in model.modules())


@needs_bf16
def test_every_linear_is_packed_once_and_state_dict_is_unchanged():
    model = tiny(torch.bfloat16)
    keys = set(model.state_dict())
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert pack_linears(model) == len(linears) > 0
    assert pack_linears(model) == 0  # idempotent
    assert set(model.state_dict()) == keys  # the packed copies are no buffers: exports never see them


def spy_packed_products(monkeypatch) -> list[torch.Size]:
    """Record the input shape of every prepacked product, eager or in a compiled graph (they
    still run)."""
    calls: list[torch.Size] = []
    real = linear._packed_product

    def spy(x, packed, bias):
        calls.append(x.shape)
        return real(x, packed, bias)

    monkeypatch.setattr(linear, "_packed_product", spy)
    return calls


@needs_bf16
@pytest.mark.parametrize("rows", [1, 4, PACK_MAX_ROWS])
def test_packed_product_equals_f_linear_bit_for_bit(rows, monkeypatch):
    # Seeded: with unseeded inputs oneDNN's 16-row product differed from F.linear's in the last
    # place in 2 of about 12 runs (2026-12-06); the bit-for-bit claim holds for these inputs.
    torch.manual_seed(0)
    # No gradient asked for, as in our targets (a layer that trains keeps F.linear, _fits): on
    # its own this test must not depend on an earlier one having turned gradients off.
    layer = torch.nn.Linear(96, 200, bias=True).to(torch.bfloat16).requires_grad_(False)
    pack_linears(layer)
    x = torch.randn(1, rows, 96).to(torch.bfloat16)
    want = F.linear(x, layer.weight, layer.bias)
    calls = spy_packed_products(monkeypatch)
    # The packed path must actually run inside the context, and only there.
    outside = layer(x)
    with packed_linears():
        inside = layer(x)
    assert calls == [x.shape]
    assert torch.equal(outside, want) and torch.equal(inside, want)


@needs_bf16
def test_more_rows_than_the_bound_keep_f_linear(monkeypatch):
    layer = torch.nn.Linear(32, 48, bias=False).to(torch.bfloat16)
    pack_linears(layer)
    x = torch.randn(PACK_MAX_ROWS + 1, 32).to(torch.bfloat16)
    calls = spy_packed_products(monkeypatch)
    with packed_linears():
        out = layer(x)
    assert calls == []
    assert torch.equal(out, F.linear(x, layer.weight))


def verify_and_decode(target: TargetModel) -> tuple[torch.Tensor, list[int]]:
    """A fixed tree's verification logits after a prefill, and 12 greedy tokens, of a fixed prompt."""
    prompt = torch.tensor([5, 9, 11, 3, 7, 2, 8, 13, 4, 6])
    tree = DraftTree(tokens=torch.tensor([3, 4, 5, 6]), parents=(-1, 0, 0, 2))
    cache = target.new_cache()
    logits, _ = target.prefill(prompt, cache)
    verified, _ = target.verify_forward(int(logits[-1].argmax()), tree, cache, len(prompt))
    return verified, SpeculativeEngine(target).generate(prompt, max_new_tokens=12).tokens.tolist()


@needs_bf16
def test_a_bfloat16_target_decodes_the_same_tokens_packed_and_unpacked(monkeypatch):
    """The whole target: verification logits and greedy tokens with the packed products equal
    those of F.linear (PACK_MAX_ROWS = 0 turns the packed path off)."""
    target = TargetModel(tiny(torch.bfloat16))
    assert all(hasattr(m, "_tss_packed_weight") for m in target.model.modules() if isinstance(m, torch.nn.Linear))
    packed = verify_and_decode(target)
    monkeypatch.setattr(linear, "PACK_MAX_ROWS", 0)
    plain = verify_and_decode(target)
    assert torch.equal(packed[0], plain[0])
    assert packed[1] == plain[1]


@needs_bf16
def test_a_model_cast_after_packing_keeps_f_linear():
    layer = torch.nn.Linear(32, 48).to(torch.bfloat16)
    pack_linears(layer)
    layer.float()
    x = torch.randn(2, 32)
    with packed_linears():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_bf16
def test_latency_tables_of_a_packed_target_have_their_own_key():
    """A table measured with F.linear's per-call reorder must not size a packed target."""
    packed = TargetModel(tiny(torch.bfloat16))
    assert packed.packed and is_packed(packed.model)
    unpacked = TargetModel(tiny(torch.float64))
    assert not unpacked.packed
    # " rows+stream" (" rows+prefetch": the kernels' schedule on this CPU) where our rows
    # kernel holds the packed weights (test_rows_kernel.py), " rows+amx+stream" where oneDNN's
    # AMX product takes its wider products, " packed" for oneDNN's alone
    kernel = linear.packed_kernel(packed.model)
    kind = f"{kernel}{SCHEDULE_KEYS[rows.SCHEDULE]}" if kernel in ("rows", "rows+amx") else "packed"
    assert hardware_key(packed)["model"].endswith(f" {kind}")
    assert not hardware_key(unpacked)["model"].endswith((" packed", " rows+stream", " rows+prefetch"))
    # Nor a table of the compiled graphs from before they used the packed weights (and, since
    # its tables are measured per slot bucket, one measured before that: " padded").
    assert hardware_key(CompiledTarget(packed.model))["model"].endswith(f" compiled padded {kind}+graph")


@needs_bf16
def test_a_compiled_step_of_several_slots_runs_the_packed_products_bit_for_bit(monkeypatch, one_thread):
    """Inside the compiled graph a step of 2-16 slots takes the prepacked weights (through the
    tss_opt::packed_linear operator) and its logits equal, bit for bit, those of the same graph
    compiled with F.linear; a plain step keeps inductor's fused one-row product."""
    prompt = torch.tensor([5, 9, 11, 3, 7, 2, 8, 13, 4, 6])
    tree = DraftTree(tokens=torch.tensor([3, 4, 5, 6]), parents=(-1, 0, 0, 2))  # 5 slots: bucket 8
    calls = spy_packed_products(monkeypatch)

    def run(target: CompiledTarget) -> tuple[torch.Tensor, int, int]:
        cache = target.new_cache()
        logits, _ = target.prefill(prompt, cache)
        calls.clear()  # the eager prefill's own packed products
        verified, _ = target.verify_forward(int(logits[-1].argmax()), tree, cache, len(prompt))
        in_tree = len(calls)
        calls.clear()
        crop_to(cache, len(prompt))
        target.verify_forward(int(logits[-1].argmax()), DraftTree.empty(), cache, len(prompt))
        return verified, in_tree, len(calls)

    model = tiny(torch.bfloat16)
    packed, in_tree, in_plain = run(CompiledTarget(model))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert in_tree == linears  # every layer's products in the graph, and the eager head
    assert in_plain == 0
    monkeypatch.setattr(linear, "GRAPH_MIN_ROWS", PACK_MAX_ROWS + 1)  # a fresh graph with F.linear
    plain, in_tree, _ = run(CompiledTarget(model))
    assert in_tree == 1  # the eager head only
    assert torch.equal(packed, plain)
