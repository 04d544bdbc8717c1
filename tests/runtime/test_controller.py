"""The controller: per-request skip sets on one model, dense fallbacks, mapping checks."""

from __future__ import annotations

import logging

import pytest
import torch
from runtime_support import TINY_ID, pld

from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.mapping import MappingError, load_mapping
from tss_opt.runtime import DomainRouter, TSSController

N_NEW = 24
SKIPS = {"qa": [1], "translation": [2, 3], "summarization": []}
PROMPT = "the cat sat on the mat. the cat sat on the hat. the dog sat on the"


def reference(target, ids, skip):
    engine = SpeculativeEngine(target, pld())
    return engine.generate(ids, max_new_tokens=N_NEW, skip=skip).tokens.tolist()


@pytest.fixture
def controller(tiny, tiny_target, write_mapping):
    path = write_mapping(SKIPS)
    return TSSController(tiny_target, tiny.tokenizer, path, pld, (), model_id=TINY_ID, max_new_tokens=N_NEW)


def test_switches_skip_sets_between_requests_on_one_model(tiny, tiny_target, controller):
    params = [p.data_ptr() for p in tiny.model.parameters()]
    ids = controller.prompt_ids(PROMPT)
    refs = {d: reference(tiny_target, ids, s) for d, s in SKIPS.items()}
    refs["dense"] = reference(tiny_target, ids, [])
    assert refs["qa"] != refs["dense"] and refs["translation"] != refs["dense"], "skip sets must change the output"
    # Interleave domains: each request gets its own skip set, whatever ran before it.
    for domain in ["qa", "translation", "qa", "summarization", "translation"]:
        res = controller.generate(PROMPT, domain)
        assert res.domain == domain and not res.routed
        assert res.skip_set == frozenset(SKIPS[domain])
        assert res.tokens.tolist() == refs[domain]
        assert res.text == tiny.tokenizer.decode(res.tokens, skip_special_tokens=True)
        # The skip set held for every verification forward of the request.
        L, k = tiny_target.num_layers, len(SKIPS[domain])
        assert res.stats.skipped_layers == k
        assert res.stats.verify_layer_forwards == res.stats.steps * (L - k)
    # Same weights, same module objects, no patched layer left behind.
    assert controller.target.model is tiny.model
    assert [p.data_ptr() for p in tiny.model.parameters()] == params
    assert all("forward" not in layer.__dict__ for layer in tiny.model.model.layers)


def test_token_ids_prompt_and_labels_are_trimmed(tiny_target, controller):
    ids = controller.prompt_ids(PROMPT)
    res = controller.generate(ids, " qa ")
    assert res.domain == "qa" and res.tokens.tolist() == reference(tiny_target, ids, SKIPS["qa"])


def test_no_domain_without_router_runs_dense(tiny_target, controller):
    res = controller.generate(PROMPT)
    assert res.domain is None and res.skip_set == frozenset() and not res.routed
    assert res.tokens.tolist() == reference(tiny_target, controller.prompt_ids(PROMPT), [])


@pytest.mark.parametrize("domain", ["poetry", "mmlu"])  # unknown label / shipped domain not mapped
def test_unmapped_domain_runs_dense_and_is_logged_once(tiny_target, controller, caplog, domain):
    caplog.set_level(logging.WARNING, logger="tss_opt.runtime")
    for _ in range(3):
        res = controller.generate(PROMPT, domain)
        assert res.domain == domain and res.skip_set == frozenset()
        assert res.tokens.tolist() == reference(tiny_target, controller.prompt_ids(PROMPT), [])
    notes = [r for r in caplog.records if domain in r.getMessage()]
    assert len(notes) == 1
    assert "no entry in the mapping" in notes[0].getMessage() and "qa" in notes[0].getMessage()
    controller.generate(PROMPT, "other")
    assert sum("'other'" in r.getMessage() for r in caplog.records) == 1


def test_unlabeled_far_away_prompt_runs_dense(tiny, tiny_target, write_mapping):
    tok = tiny.tokenizer

    def ids(text):
        return torch.tensor(tok(text)["input_ids"])

    prompts = {
        "qa": [ids(f"question {i}: who wrote the book number {i}?") for i in range(4)],
        "translation": [ids(f"translate german to english: das haus nummer {i} ist gross") for i in range(4)],
    }
    router = DomainRouter.fit(tiny_target, prompts, model_id=TINY_ID)
    c = TSSController(tiny_target, tok, write_mapping(SKIPS), pld, (), router=router, model_id=TINY_ID, max_new_tokens=N_NEW)
    near = c.generate(ids("question 9: who wrote the book number 9?"))
    assert near.routed and near.domain == "qa" and near.skip_set == frozenset(SKIPS["qa"])
    far = ids("}}}}~~~~~^^^^^^||||||||@@@@@@@@@@")
    res = c.generate(far)
    assert not res.routed and res.domain is None and res.skip_set == frozenset()
    assert res.route is not None and res.route.nearest in SKIPS and res.similarity < res.route.threshold
    assert res.tokens.tolist() == reference(tiny_target, far, [])


def test_mapping_for_another_model_is_refused(tiny, tiny_target, write_mapping):
    other = write_mapping(SKIPS, name="other.yaml", model="HuggingFaceTB/SmolLM2-135M", num_layers=30)
    with pytest.raises(MappingError, match="SmolLM2-135M.*30 layers.*tiny-llama-4l-seed0"):
        TSSController(tiny_target, tiny.tokenizer, other, pld, (), model_id=TINY_ID)
    # Same layer count, other model id.
    same_size = write_mapping(SKIPS, name="same.yaml", model="another-4-layer-model")
    with pytest.raises(MappingError, match="another-4-layer-model"):
        TSSController(tiny_target, tiny.tokenizer, same_size, pld, (), model_id=TINY_ID)
    # Without a model id the layer count is still checked.
    with pytest.raises(MappingError, match="30 layers"):
        TSSController(tiny_target, tiny.tokenizer, load_mapping(other), pld, ())


def test_missing_or_corrupt_mapping_is_a_clear_error(tiny, tiny_target, tmp_path):
    missing = tmp_path / "nope" / "mapping.yaml"
    with pytest.raises(MappingError, match=f"{missing}.*does not exist"):
        TSSController(tiny_target, tiny.tokenizer, missing, pld, (), model_id=TINY_ID)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("domains: {qa: [1, 2\n", encoding="utf-8")
    with pytest.raises(MappingError, match=f"{bad_yaml}.*not valid YAML"):
        TSSController(tiny_target, tiny.tokenizer, bad_yaml, pld, (), model_id=TINY_ID)
    bad_entry = tmp_path / "entry.yaml"
    bad_entry.write_text(f"model: {TINY_ID}\nnum_layers: 4\ndomains:\n  qa: {{skip_set: [7]}}\n", encoding="utf-8")
    with pytest.raises(MappingError, match=f"{bad_entry}.*qa"):
        TSSController(tiny_target, tiny.tokenizer, bad_entry, pld, (), model_id=TINY_ID)


def test_bad_scope_is_refused(tiny, tiny_target, write_mapping):
    with pytest.raises(ValueError, match="scope='both'"):
        TSSController(tiny_target, tiny.tokenizer, write_mapping(SKIPS), pld, (), model_id=TINY_ID, scope="both")


def test_same_seed_same_output(tiny_target, tiny, write_mapping) -> None:
    """A seeded request is reproducible through the controller, also with a drafter
    that samples its drafts (its stream restarts per request)."""
    from tss_opt.decoding.drafters import DraftModelDrafter

    def drafter() -> DraftModelDrafter:
        return DraftModelDrafter(tiny.model, num_tokens=3, temperature=0.8, skip=[2], seed=1)

    c = TSSController(tiny_target, tiny.tokenizer, write_mapping(SKIPS), drafter, (), model_id=TINY_ID,
                      temperature=0.8, max_new_tokens=16)
    domain = next(iter(SKIPS))
    a = c.generate("tell me", domain, seed=4).tokens.tolist()
    b = c.generate("tell me", domain, seed=4).tokens.tolist()
    other = c.generate("tell me", domain, seed=5).tokens.tolist()
    assert a == b and a != other
