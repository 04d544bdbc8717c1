"""The compiled verification step: the eager step's tokens, one graph per bucket.

Compiling with inductor takes 5-30 s (one graph per bucket) on the shared 2-core machine, so one target is compiled
per module and every test reuses it (the graphs it holds are what the recompile test counts).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from reference import greedy_dense_prefill, greedy_no_cache

from tss_opt.decoding.compiled import BUCKETS, CompiledTarget, layers_alike, tensor_guards
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.drafters import PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.sizing import hardware_key, measure_latency
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree

N_NEW = 24



@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """One torch thread (tests/conftest.py): compiling and tiny forwards on the shared cores."""


class _OracleTree(Drafter):
    """A tree with one branch of the reference's next tokens (its last one wrong) beside a
    branch of wrong tokens: acceptance keeps non-contiguous slots, as real tree drafters do."""

    def __init__(self, reference: list[int], prompt_len: int) -> None:
        self.reference, self.prompt_len = reference, prompt_len

    def propose(self, context: torch.Tensor) -> DraftTree:
        done = len(context) - self.prompt_len
        right = self.reference[done : done + 3]
        if not right:
            return DraftTree.empty()
        wrong = [(t + 1) % 256 for t in right]
        tokens = [wrong[0], *right[:-1], wrong[-1], wrong[0]]
        # node 0: wrong child of the root; 1..: the right chain; then a wrong leaf off the
        # chain's last right node and a wrong grandchild of the wrong branch.
        k = len(right) - 1
        parents = (-1, -1, *range(1, k), k if k else -1, 0)
        return DraftTree(tokens=torch.tensor(tokens[: len(parents)]), parents=parents)


@pytest.fixture(scope="module")
def prompt(tiny64) -> torch.Tensor:
    text = "the cat sat on the mat. the cat sat on the hat. the dog sat on the"
    return tiny64.tokenizer(text, return_tensors="pt").input_ids[0]


@pytest.fixture(scope="module")
def compiled(tiny64) -> CompiledTarget:
    return CompiledTarget(tiny64.model)


def _drafter(name: str, reference: list[int], prompt_len: int) -> Drafter | None:
    return {"none": None, "chain": PromptLookupDrafter(num_tokens=6), "tree": _OracleTree(reference, prompt_len)}[name]


@pytest.mark.parametrize("scope", ["verify", "all"])
@pytest.mark.parametrize("skip", [(), (1,), (0, 2)])
@pytest.mark.parametrize("name", ["none", "chain", "tree"])
def test_compiled_emits_the_eager_tokens(tiny64, compiled, prompt, skip, name, scope):
    ref = (greedy_dense_prefill if scope == "verify" else greedy_no_cache)(tiny64.model, prompt, N_NEW, skip)
    eager = SpeculativeEngine(TargetModel(tiny64.model), _drafter(name, ref, len(prompt)))
    fast = SpeculativeEngine(compiled, _drafter(name, ref, len(prompt)))
    want = eager.generate(prompt, max_new_tokens=N_NEW, skip=skip, scope=scope)
    got = fast.generate(prompt, max_new_tokens=N_NEW, skip=skip, scope=scope)
    if skip:
        assert ref != greedy_no_cache(tiny64.model, prompt, N_NEW), "the skip set must change the output"
    assert want.tokens.tolist() == ref
    assert got.tokens.tolist() == ref
    assert got.stats.verify_layer_forwards == want.stats.verify_layer_forwards
    if name == "tree":
        assert got.stats.draft_accepted > 0 and got.stats.draft_accepted < got.stats.draft_proposed


def test_tree_verification_matches_eager(tiny64, compiled, prompt):
    tree = DraftTree(tokens=torch.tensor([5, 6, 7, 8, 9]), parents=(-1, -1, 0, 0, 2))
    eager = TargetModel(tiny64.model)
    for skip in [(), (2, 3)]:
        with eager.skip(skip):
            c1 = eager.new_cache()
            eager.prefill(prompt, c1)
            want = eager.verify_forward(3, tree, c1, len(prompt))
            c2 = compiled.new_cache()
            compiled.prefill(prompt, c2)
            got = compiled.verify_forward(3, tree, c2, len(prompt))
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)  # inductor rounds differently
        assert c2.get_seq_length() == c1.get_seq_length() == len(prompt) + len(tree) + 1


def test_a_change_of_skip_set_does_not_recompile(tiny64, prompt):
    target = CompiledTarget(tiny64.model)
    engine = SpeculativeEngine(target)  # plain decoding: one-slot steps, bucket 1
    engine.generate(prompt, max_new_tokens=4)
    first = target.compilations
    assert first == 2, "one graph serves every layer, one the norm and head of a plain step"
    for skip in [(1,), (0, 2), (3,), (0, 1, 2)]:
        engine.generate(prompt, max_new_tokens=4, skip=skip)
    # a longer context reads a wider key window (marked dynamic): still the same graph
    engine.generate(torch.cat([prompt] * 8), max_new_tokens=4, skip=(2,))
    assert target.compilations == first


def test_layers_alike_share_a_graph_on_lean_guards_and_layers_that_differ_keep_every_guard(tiny64, compiled, prompt):
    """The lean guards (tensor_guards) drop dynamo's checks of module attributes, so they are
    used only when every layer is alike; a layer that differs (here: its attention's scaling,
    a constant the graph bakes in) gets a graph of its own, and the output stays the eager one."""
    assert compiled.lean_guards and layers_alike(compiled.layers)
    model = copy.deepcopy(tiny64.model)
    model.model.layers[1].self_attn.scaling *= 1.5
    target = CompiledTarget(model)
    assert not target.lean_guards
    tree = DraftTree(tokens=torch.tensor([5, 6, 7]), parents=(-1, 0, 0))
    eager = TargetModel(model)
    c1, c2 = eager.new_cache(), target.new_cache()
    eager.prefill(prompt, c1)
    target.prefill(prompt, c2)
    want = eager.verify_forward(3, tree, c1, len(prompt))
    got = target.verify_forward(3, tree, c2, len(prompt))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert target.compilations == 2, "one graph per kind of layer"


def test_tensor_guards_keep_tensors_state_and_layer_indices():
    def entry(kind: str, name: str = "") -> SimpleNamespace:
        return SimpleNamespace(guard_type=kind, name=name)

    entries = [entry("TENSOR_MATCH", "hidden"), entry("GRAD_MODE"), entry("SHAPE_ENV"),
               entry("EQUALS_MATCH", "layer._modules['self_attn'].layer_idx"),
               entry("CONSTANT_MATCH", "layer._modules['mlp']._modules['up_proj']._parameters['bias']"),
               entry("EMPTY_NN_MODULE_HOOKS_DICT", "layer._forward_hooks"), entry("ID_MATCH", "G['torch']")]
    assert tensor_guards(entries) == [True, True, True, True, False, False, False]


def test_buckets_fit_dynamos_graph_limit():
    assert len(BUCKETS) <= torch._dynamo.config.recompile_limit


def test_a_reused_prefill_stays_compact(tiny64, compiled, prompt):
    from tss_opt.decoding.cache import InPlaceLayer
    from tss_opt.decoding.prefill import dense_prefill

    stored = dense_prefill(compiled, prompt)
    want = SpeculativeEngine(TargetModel(tiny64.model)).generate(prompt, max_new_tokens=N_NEW, skip=(1,))
    got = SpeculativeEngine(compiled).generate(prompt, max_new_tokens=N_NEW, skip=(1,), prefill=stored)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.stats.prefill_layer_forwards == 0
    # the request made its own copy static; the store's cache keeps its size
    assert not any(isinstance(layer, InPlaceLayer) for layer in stored.cache.layers)


def test_compile_setting_builds_a_compiled_target_and_keeps_default_study_names():
    from tss_opt.assembly import assemble, compose_config, study_identity

    plain = compose_config(["+domain=qa", "+model=tiny"])
    on = compose_config(["+domain=qa", "+model=tiny", "compile=true"])
    assert plain.compile is False
    name_off, meta_off = study_identity(plain)
    name_on, meta_on = study_identity(on)
    assert "compile" not in meta_off["protocol"]  # default: the study names of before
    assert meta_on["protocol"]["compile"] is True and name_on != name_off
    assert type(assemble(on).target) is CompiledTarget
    assert type(assemble(plain).target) is TargetModel


def test_the_window_past_the_cached_length_is_finite(tiny64, prompt):
    # The compiled attention reads (masked) positions never written; a NaN there would still
    # reach the output through softmax @ V (0 * NaN), as fresh memory did in bfloat16.
    from tss_opt.decoding.cache import preallocate

    target = TargetModel(tiny64.model)
    cache = target.new_cache()
    target.prefill(prompt, cache)
    preallocate(cache, 256)
    for layer in cache.layers:
        keys, values = layer.buffers(256)
        assert torch.equal(keys[..., len(prompt) :, :], torch.zeros_like(keys[..., len(prompt) :, :]))
        assert torch.equal(values[..., len(prompt) :, :], torch.zeros_like(values[..., len(prompt) :, :]))


def test_the_batch_engine_runs_on_a_compiled_target(tiny64, compiled, prompt):
    # The server's continuous batching (ragged.py) is not compiled; it must still run (eagerly)
    # on the target compile=true builds, with the tokens of each request alone.
    from tss_opt.decoding.batch import BatchEngine

    batch = BatchEngine(compiled)
    skips = [(), (1,), (0, 2)]
    rows = [batch.admit(prompt, max_new_tokens=8, skip=s, drafter=PromptLookupDrafter(num_tokens=3)) for s in skips]
    batch.run()
    for row, skip in zip(rows, skips):
        assert row.result().tokens.tolist() == greedy_dense_prefill(tiny64.model, prompt, 8, skip)


def test_latency_is_measured_per_bucket(tiny64, compiled):
    """A compiled step pads its slots, so its table holds the largest node count of each bucket
    and prices a chain by its bucket: 4 nodes (5 slots, the 8-slot bucket) cost what 7 do."""
    table = measure_latency(compiled, (0, 1, 2, 4, 8), prefix_len=16, repeats=1)
    assert table.padded and table.sizes == [0, 1, 3, 7, 8] and table.at(4) == table.at(7)
    assert "padded" in hardware_key(compiled)["model"] and "padded" not in hardware_key(TargetModel(tiny64.model))["model"]


def test_a_tree_past_the_largest_bucket_verifies_eagerly(tiny64, compiled, prompt):
    n = BUCKETS[-1]  # root + n nodes: one slot more than the largest bucket
    tree = DraftTree.chain(torch.arange(n) % 50 + 3)
    eager = TargetModel(tiny64.model)
    before = compiled.compilations
    c1, c2 = eager.new_cache(), compiled.new_cache()
    eager.prefill(prompt, c1)
    compiled.prefill(prompt, c2)
    want = eager.verify_forward(3, tree, c1, len(prompt))
    got = compiled.verify_forward(3, tree, c2, len(prompt))
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)  # the eager forward itself
    assert compiled.compilations == before
