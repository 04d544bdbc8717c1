"""Compiled graphs called past dynamo's frame (decoding/direct.py): only once checked, and
bit for bit what the same graph gives through dynamo."""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding.cache import crop_to
from tss_opt.decoding.compiled import CompiledTarget
from tss_opt.decoding.direct import DirectCompiled, source_getter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.tree import DraftTree


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """One torch thread (tests/conftest.py)."""


def test_source_getter_reads_module_chains_and_sizes():
    layer = torch.nn.Sequential(torch.nn.Linear(3, 4))
    layer.register_buffer("scale", torch.ones(2))
    layer[0].extra = torch.zeros(5)
    mask = torch.zeros(1, 1, 2, 7)
    args = (layer, mask, (mask, layer))
    params = ("layer", "mask", "pair")
    read = lambda s: source_getter(s, params)(args)  # noqa: E731
    assert read("L['layer']._modules['0']._parameters['weight']") is layer[0].weight
    assert read("L['layer']._buffers['scale']") is layer.scale
    assert read("L['layer']._modules['0'].extra") is layer[0].extra
    assert read("L['mask'].size()[3]") == 7
    assert read("L['pair'][1]._modules['0']._parameters['bias']") is layer[0].bias
    # what is not a chain of the call's arguments stays with dynamo
    for source in ("G['PACK_MAX_ROWS']", "L['other']", "L['mask'].stride()[0]", "L['layer'].__dict__['extra']"):
        assert source_getter(source, params) is None, source


def _counting():
    seen = {"compiles": 0}

    def backend(gm, example_inputs):
        seen["compiles"] += 1
        return torch._dynamo.lookup_backend("inductor")(gm, example_inputs)

    return backend, seen


def _scaled_sum(weight: torch.Tensor, x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    return (x @ weight) * window.sum(-1, keepdim=True)


def test_a_key_goes_direct_after_a_call_that_reused_its_graph_and_gives_the_same_bits():
    backend, seen = _counting()
    fn = DirectCompiled(_scaled_sum, backend, varying=frozenset({"L['window'].size()[1]"}), fullgraph=True, dynamic=False)
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    x = torch.randn(2, 8, generator=g)

    def window(n: int) -> torch.Tensor:
        t = torch.randn(2, n, generator=g)
        torch._dynamo.maybe_mark_dynamic(t, 1)
        return t

    first = window(5)
    a = fn("k", w1, x, first)  # compiles
    assert seen["compiles"] == 1 and "k" not in fn.direct
    b = fn("k", w2, x, window(9))  # another weight and width, the same graph: checked
    assert seen["compiles"] == 1 and "k" in fn.direct and fn.direct_calls == 0
    win = window(13)
    reference = DirectCompiled(_scaled_sum, backend, enabled=False, fullgraph=True, dynamic=False)
    want = reference("k", w1, x, win)
    got = fn("k", w1, x, win)
    assert fn.direct_calls == 1 and not reference.direct
    assert torch.equal(got, want), "direct calls run the same graph on the same inputs"
    torch.testing.assert_close(a, _scaled_sum(w1, x, first))
    assert b.shape == (2, 8)


def test_a_size_compiled_in_as_a_constant_keeps_its_key_with_dynamo():
    backend, seen = _counting()
    fn = DirectCompiled(_scaled_sum, backend, varying=frozenset({"L['window'].size()[1]"}), fullgraph=True, dynamic=False)
    x, w = torch.ones(2, 8), torch.ones(8, 8)
    for _ in range(3):
        fn("k", w, x, torch.ones(2, 5))  # not marked dynamic: the width 5 is baked into the graph
    assert seen["compiles"] == 1 and not fn.direct
    assert torch.equal(fn("k", w, x, torch.ones(2, 6)), _scaled_sum(w, x, torch.ones(2, 6)))  # dynamo recompiles
    assert seen["compiles"] == 2


class _Indexed(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.weight = torch.nn.Parameter(torch.ones(4))


def _by_layer(layer: _Indexed, x: torch.Tensor) -> torch.Tensor:
    return x * layer.weight * (2.0 if layer.layer_idx == 0 else 3.0)


def test_a_key_whose_calls_compiled_two_graphs_stays_with_dynamo():
    """Layers that branch on ``layer_idx`` get a graph each (tensor_guards keeps that guard);
    running layer 0's graph for layer 1 would be wrong, so such a key never goes direct."""
    from tss_opt.decoding.compiled import tensor_guards

    backend, seen = _counting()
    fn = DirectCompiled(_by_layer, backend, fullgraph=True, dynamic=False, options={"guard_filter_fn": tensor_guards})
    layers, x = [_Indexed(0), _Indexed(1)], torch.ones(4)
    with torch.no_grad():
        for _ in range(3):
            outs = [fn("k", layer, x) for layer in layers]
    assert seen["compiles"] == 2 and not fn.direct
    assert outs[0].tolist() == [2.0] * 4 and outs[1].tolist() == [3.0] * 4


def _returns_an_input(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, y * 2


def test_a_result_that_is_not_the_graphs_output_keeps_its_key_with_dynamo():
    backend, _ = _counting()
    fn = DirectCompiled(_returns_an_input, backend, fullgraph=True, dynamic=False)
    x = torch.ones(3)
    for _ in range(3):
        out = fn(None, x, torch.ones(3))
    assert out[0] is x and not fn.direct


@pytest.fixture(scope="module")
def prompt(tiny64) -> torch.Tensor:
    text = "the cat sat on the mat. the cat sat on the hat. the dog sat on the"
    return tiny64.tokenizer(text, return_tensors="pt").input_ids[0]


def test_the_compiled_target_goes_direct_with_the_bits_of_dynamos_calls(tiny64, prompt):
    """Plain steps and a tree step, dense and sparse, past a window of 128 positions and a
    buffer's doubling: the direct target's logits equal, bit for bit, those of the same
    graphs called through dynamo; the skip set and the window never recompile."""
    direct, through = CompiledTarget(tiny64.model), CompiledTarget(tiny64.model, direct=False)
    assert direct.direct and not through.direct
    tree = DraftTree(tokens=torch.tensor([5, 6, 7]), parents=(-1, 0, 0))
    for skip in [(), (1,)]:
        caches = [t.new_cache() for t in (direct, through)]
        with direct.skip(skip):  # one model, one skip controller for both targets
            for t, c in zip((direct, through), caches):
                t.prefill(prompt, c)
            n = len(prompt)
            for step in range(300):  # the buffers (window + 512 positions) double past 128 cached
                token = int(prompt[step % len(prompt)])
                draft = tree if step % 50 == 7 else DraftTree.empty()
                a = direct.verify_forward(token, draft, caches[0], n)
                b = through.verify_forward(token, draft, caches[1], n)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), f"skip {skip}, step {step}"
                n += 1  # the root stays cached, a tree's slots are dropped
                for c in caches:
                    crop_to(c, n)
    assert direct.compilations == through.compilations
    assert set(direct._step.direct) == {1, 4} and direct._step.direct_calls > 500
    assert direct._head is not None and direct._head.direct_calls > 500
    assert not through._step.direct and through._step.direct_calls == 0


def test_every_guard_keeps_every_call_with_dynamo(tiny64, prompt):
    target = CompiledTarget(tiny64.model, lean_guards=False)
    assert not target.direct
    SpeculativeEngine(target).generate(prompt, max_new_tokens=6)
    assert not target._step.direct and target._step.direct_calls == 0
