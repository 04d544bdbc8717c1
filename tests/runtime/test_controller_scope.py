"""The controller serves each domain in its mapping entry's skip scope."""

from __future__ import annotations

import logging

from runtime_support import TINY_ID, pld

from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.runtime import TSSController

N_NEW = 24
SKIPS = {"qa": [0], "translation": [0], "summarization": []}
PROMPT = "the cat sat on the mat. the cat sat on the hat. the dog sat on the"


def reference(target, ids, skip, scope):
    engine = SpeculativeEngine(target, pld())
    return engine.generate(ids, max_new_tokens=N_NEW, skip=skip, scope=scope).tokens.tolist()


def test_each_domain_runs_in_its_entry_scope(tiny, tiny_target, write_mapping):
    # Same skip set, two scopes: qa was searched with scope=all, translation's entry predates
    # the scope key (read as verify).
    path = write_mapping(SKIPS, scopes={"qa": "all"})
    ctl = TSSController(tiny_target, tiny.tokenizer, path, pld, (), model_id=TINY_ID, max_new_tokens=N_NEW)
    ids = ctl.prompt_ids(PROMPT)
    ref_all, ref_verify = reference(tiny_target, ids, {0}, "all"), reference(tiny_target, ids, {0}, "verify")
    assert ref_all != ref_verify, "the scope must change the output, or this test proves nothing"
    for domain in ["qa", "translation", "qa"]:
        res = ctl.generate(ids, domain)
        expected = ref_all if domain == "qa" else ref_verify
        assert res.tokens.tolist() == expected
        assert res.scope == ("all" if domain == "qa" else "verify")
        # scope=all skips the layer in the prefill too; verify prefills densely.
        assert res.stats.prefill_layer_forwards == (3 if domain == "qa" else 4)
    assert ctl.scope_for("summarization") == "verify" and ctl.scope_for(None) == "verify"
    assert ctl.generate(ids, None).scope == "verify"


def test_an_explicit_scope_overrides_every_entry_and_says_so(tiny, tiny_target, write_mapping, caplog):
    path = write_mapping(SKIPS, scopes={"qa": "all"})
    with caplog.at_level(logging.WARNING, logger="tss_opt.runtime.controller"):
        ctl = TSSController(
            tiny_target, tiny.tokenizer, path, pld, (), model_id=TINY_ID, max_new_tokens=N_NEW, scope="verify"
        )
    assert "scope=verify overrides the mapping's scope of qa" in caplog.text
    ids = ctl.prompt_ids(PROMPT)
    res = ctl.generate(ids, "qa")
    assert res.scope == "verify" and res.tokens.tolist() == reference(tiny_target, ids, {0}, "verify")
