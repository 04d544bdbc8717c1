"""The bounded prefill store: its byte budget holds, least recently used prefills go first,
and the search releases the calibration prefills before validation."""

from __future__ import annotations

import pytest
import torch

from tss_opt.config.schema import TSSConfig
from tss_opt.decoding.prefill import DEFAULT_PREFILL_STORE_GIB, GIB, PrefillStore, dense_prefill
from tss_opt.decoding.target import TargetModel


def _prompts(tiny, n: int) -> list[torch.Tensor]:
    texts = ["the cat sat on the mat", "ab ab ab ab ab", "hello there, hello there friend", "one two three four"]
    return [tiny.tokenizer(t, return_tensors="pt").input_ids[0] for t in texts[:n]]


def test_budget_holds_and_least_recently_used_goes_first(tiny):
    target = TargetModel(tiny.model)
    prompts = _prompts(tiny, 4)
    sizes = [PrefillStore(1 << 40)._nbytes(dense_prefill(target, p)) for p in prompts]
    # Expected size: K and V of every layer, the last logits and the prompt's hidden states.
    cfg = tiny.model.config
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert sizes[0] == len(prompts[0]) * (kv_per_token + cfg.hidden_size * 4) + cfg.vocab_size * 4
    budget = sizes[0] + sizes[1] + sizes[2] - 1  # room for two of the first three, not three
    store: PrefillStore = PrefillStore(budget)
    calls: list[int] = []

    def get(i: int):
        return store.get(i, lambda: (calls.append(i), dense_prefill(target, prompts[i]))[1])

    get(0), get(1), get(0)  # 0 is now the most recent
    assert calls == [0, 1] and store.hits == 1
    get(2)  # over budget: 1 (least recently used) is evicted, 0 stays
    assert list(store) == [0, 2] and store.evictions == 1
    assert store.nbytes <= budget and store.peak_bytes <= budget
    get(0)
    assert calls == [0, 1, 2]  # a hit, no recomputation
    get(1)  # recomputed after its eviction
    assert calls == [0, 1, 2, 1] and store.nbytes <= budget
    # A prefill larger than the whole budget is returned, not kept.
    small: PrefillStore = PrefillStore(10)
    assert small.get(0, lambda: dense_prefill(target, prompts[0])).prompt.numel() == len(prompts[0])
    assert len(small) == 0 and small.nbytes == 0
    store.clear()
    assert len(store) == 0 and store.nbytes == 0
    with pytest.raises(ValueError, match="prefill_store_gib=-1.0; expected a size in GiB >= 0"):
        PrefillStore.from_gib(-1)


def test_default_budget_is_the_documented_one():
    assert TSSConfig().prefill_store_gib == DEFAULT_PREFILL_STORE_GIB
    assert PrefillStore.from_gib(None).budget_bytes == int(DEFAULT_PREFILL_STORE_GIB * GIB)


def test_evaluator_under_a_small_budget_keeps_its_bound_and_its_tokens(tiny):
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir
    from tss_opt.decoding.drafters import PromptLookupDrafter
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.evaluation.domains import load_domain
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
    from tss_opt.evaluation.prompt_set import PromptSet

    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))
    prompts = PromptSet(dom.split("calibration")[:3], dom.metric, DecodeProtocol(max_new_tokens=6))

    def ev(**kw):
        return SpecDecodeEvaluator(
            TargetModel(tiny.model), tiny.tokenizer, lambda: PromptLookupDrafter(num_tokens=5), prompts,
            show_progress=False, **kw,
        )

    unbounded = ev()
    unbounded(frozenset())
    one = max(unbounded._prefills._items[i][1] for i in unbounded._prefills)
    bounded = ev(prefill_store_gib=1.5 * one / GIB)  # room for one prefill
    for skip in (frozenset(), frozenset({1})):
        a, b = unbounded(skip)["per_prompt"], bounded(skip)["per_prompt"]
        assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert len(unbounded._prefills) == 3 and len(bounded._prefills) == 1
    assert bounded._prefills.peak_bytes <= bounded._prefills.budget_bytes
    assert bounded._prefills.evictions >= 4
    assert bounded.on_examples(dom.split("validation")[:2]).prefill_store_gib == bounded.prefill_store_gib


@pytest.mark.timeout(600)
def test_search_releases_calibration_prefills_before_validation(tmp_path, monkeypatch):
    import tss_opt.cli.search as search_command
    from tss_opt.assembly import compose_config
    from tss_opt.cli.search import search

    seen: list[tuple[int, int]] = []
    real = search_command.validation_evaluator

    def spy(cfg, evaluator, domain=None):  # records the calibration store when validation starts
        seen.append((len(evaluator._prefills), evaluator._prefills.misses))
        return real(cfg, evaluator, domain)

    monkeypatch.setattr(search_command, "validation_evaluator", spy)
    cfg = compose_config([
        "+domain=translation", "+model=tiny", "search=algorithm1", "search.prompts=4", "max_new_tokens=6",
        "search.max_depth=1", "search.early_barrier=1", "search.latter_barrier=1", "search.validation_prompts=4",
        "search.eps_accept=0.5", "search.eps_metric=0.5", "search.tau_accept=0.5", "search.tau_metric=0.5",
        f"storage=sqlite:///{tmp_path / 's.db'}", f"mapping_path={tmp_path / 'map.yaml'}", "evaluator=engine",
    ])
    search(cfg)
    assert seen, "validation did not run (the search found nothing to validate)"
    kept, computed = seen[0]
    assert computed >= 4 and kept == 0  # the store was used, then released
