"""The domain router: fitting, routing, fallbacks, persistence (tiny model); accuracy (slow)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from runtime_support import TINY_ID

from tss_opt.runtime import BACKGROUND, DomainRouter, RouterError, embed_prompt, routing_accuracy


@pytest.fixture(scope="module")
def ids(tiny):
    def encode(text: str) -> torch.Tensor:
        msgs = [{"role": "user", "content": text}]
        return torch.as_tensor(tiny.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"])

    return encode


@pytest.fixture(scope="module")
def fitted(tiny_target, ids):
    prompts = {
        "qa": [ids(f"question {i}: who wrote the book number {i}?") for i in range(5)],
        "translation": [ids(f"translate german to english: das haus nummer {i} ist gross") for i in range(5)],
    }
    background = [ids(t) for t in ("write me a poem", "tell me a joke please", "hello there, friend!", "plan my trip")]
    return DomainRouter.fit(tiny_target, prompts, background=background, model_id=TINY_ID)


def test_embedding_is_dense_even_inside_a_skip_context(tiny_target, ids):
    p = ids("who wrote hamlet?")
    dense = embed_prompt(tiny_target, p)
    with tiny_target.skip([1, 2]):
        inside = embed_prompt(tiny_target, p)
        assert tiny_target.skipper.active == frozenset({1, 2})  # the request's set is back
    torch.testing.assert_close(inside, dense)
    assert dense.shape == (tiny_target.model.config.hidden_size,)


def test_shared_prefix_is_left_out(fitted, ids):
    # The ChatML opening "<|im_start|>user\n" is shared by every fitting prompt.
    assert fitted.prefix_ids == ids("x")[: len(fitted.prefix_ids)].tolist() and len(fitted.prefix_ids) >= 2


def test_routes_near_prompts_home_and_generic_ones_to_dense(fitted, ids):
    assert fitted.domains == ["qa", "translation"] and BACKGROUND in fitted.classes
    for text, want in [
        ("question 7: who wrote the book number 7?", "qa"),
        ("translate german to english: das haus nummer 8 ist gross", "translation"),
    ]:
        d = fitted.route(ids(text))
        assert d.domain == want and d.nearest == want and d.similarity >= d.threshold
        assert set(d.scores) == {"qa", "translation", BACKGROUND}
    d = fitted.route(ids("tell me a joke please!"))
    assert d.domain is None and d.nearest == BACKGROUND and math.isnan(d.threshold)


def test_below_the_threshold_runs_dense(tiny_target, fitted, ids):
    strict = DomainRouter(
        tiny_target, {d: c for d, c in zip(fitted.classes, fitted.centroids, strict=True)}, fitted.center,
        fitted.scale, 0.999, prefix_ids=fitted.prefix_ids,
    )
    d = strict.route(ids("question 7: who wrote the book number 7? and why?"))
    assert d.domain is None and d.nearest == "qa" and d.similarity < 0.999 == d.threshold


def test_calibrated_thresholds_keep_every_fitting_prompt(tiny_target, ids):
    prompts = {
        "qa": [ids(f"question {i}: who wrote the book number {i}?") for i in range(4)],
        "digits": [ids(" ".join(str(i * j) for j in range(12))) for i in range(1, 5)],
    }
    router = DomainRouter.fit(tiny_target, prompts)
    assert BACKGROUND not in router.classes and set(router.thresholds) == {"qa", "digits"}
    for domain, ps in prompts.items():
        assert [router.route(p).domain for p in ps] == [domain] * len(ps)
    far = router.route(ids("}}}}~~~~~^^^^^^||||||||@@@@@@@@@@"))
    assert far.domain is None and far.similarity < far.threshold


def test_save_and_load_give_the_same_decisions(tiny_target, fitted, ids, tmp_path):
    path = fitted.save(tmp_path / "router.json")
    loaded = DomainRouter.load(path, tiny_target, model_id=TINY_ID)
    assert loaded.classes == fitted.classes and loaded.thresholds == pytest.approx(fitted.thresholds)
    for text in ("question 3: who wrote the book number 3?", "tell me a joke please!", "zzz"):
        a, b = fitted.route(ids(text)), loaded.route(ids(text))
        assert (a.domain, a.nearest) == (b.domain, b.nearest) and a.similarity == pytest.approx(b.similarity, abs=1e-5)


def test_load_refuses_other_models_and_corrupt_files(tiny_target, fitted, tmp_path):
    path = fitted.save(tmp_path / "router.json")
    with pytest.raises(RouterError, match="fitted on model 'tiny-llama-4l-seed0', not the loaded 'other'"):
        DomainRouter.load(path, tiny_target, model_id="other")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(RouterError, match=f"{bad} is corrupt"):
        DomainRouter.load(bad, tiny_target)
    data = json.loads(path.read_text())
    data["center"] = data["center"][:10]
    data["model_id"] = None
    short = tmp_path / "short.json"
    short.write_text(json.dumps(data))
    with pytest.raises(RouterError, match="size 10 but the model's hidden size is 64"):
        DomainRouter.load(short, tiny_target)
    with pytest.raises(RouterError, match="does not exist"):
        DomainRouter.load(tmp_path / "none.json", tiny_target)


def test_fit_refuses_bad_input(tiny_target, ids):
    with pytest.raises(RouterError, match="empty: \\['qa'\\]"):
        DomainRouter.fit(tiny_target, {"qa": [], "rag": [ids("a")]})
    with pytest.raises(RouterError, match="reserved"):
        DomainRouter.fit(tiny_target, {BACKGROUND: [ids("a")]})
    with pytest.raises(RouterError, match="empty prompt"):
        embed_prompt(tiny_target, torch.tensor([], dtype=torch.long))


def test_routing_accuracy_counts_every_heldout_prompt(tiny, tiny_target, tmp_path):
    from tss_opt.evaluation.domains import load_domain

    domains = []
    for name, template in (("qa", "who wrote the book number {i}?"), ("math", "{i} + {i} * 7 = ? compute {i}")):
        lines = [json.dumps({"id": str(i), "prompt": template.format(i=i), "references": ["x"]}) for i in range(8)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines))
        domains.append(load_domain({"name": name, "data": str(tmp_path / f"{name}.jsonl"), "metric": "token_f1",
                                    "pool_size": 8, "calibration_size": 4, "validation_size": 0, "heldout_size": 4}))
    router = DomainRouter.fit_domains(tiny_target, tiny.tokenizer, domains)
    assert BACKGROUND in router.classes and router.domains == ["math", "qa"]
    rep = routing_accuracy(router, tiny.tokenizer, domains, progress=False)
    assert rep.total == 8 and {d: sum(row.values()) for d, row in rep.confusion.items()} == {"qa": 4, "math": 4}
    assert rep.accuracy == pytest.approx(sum(rep.confusion[d].get(d, 0) for d in rep.confusion) / 8)
    md = rep.to_markdown()
    assert "| true \\ routed |" in md and md.count("| dense |") == 1 and "| qa |" in md and "| math |" in md


@pytest.mark.slow
def test_routing_accuracy_on_the_embedded_model(embedded):
    """Fitted on the 16 calibration prompts of each shipped domain; routed: 16 held-out prompts
    per domain (the benchmark, benchmarks/routing.py, routes all 64)."""
    from tss_opt.config import config_dir
    from tss_opt.decoding.target import TargetModel
    from tss_opt.evaluation.domains import (
        Example,
        available_domains,
        format_prompt,
        load_domain,
        read_domain_config,
    )

    target = TargetModel(embedded.model)
    domains = [load_domain(read_domain_config(n, [config_dir()])) for n in available_domains([config_dir()])]
    router = DomainRouter.fit_domains(target, embedded.tokenizer, domains, model_id=embedded.model_id)
    rep = routing_accuracy(router, embedded.tokenizer, domains, limit=16, progress=False)
    assert rep.accuracy >= 0.85, rep.to_markdown()
    for text in ("Write a haiku about autumn leaves falling in the rain.", "asdkjh qwe zxcmn 12391 !!!"):
        d = router.route(format_prompt(embedded.tokenizer, Example(id="far", prompt=text, references=())))
        assert d.domain is None, d
