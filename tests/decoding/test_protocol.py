"""DecodeProtocol: one frozen value for how prompts are decoded, passed whole."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.config import config_dir
from tss_opt.decoding import DecodeProtocol, SpeculativeEngine
from tss_opt.decoding.drafters import PromptLookupDrafter
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import format_prompt, load_domain
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.evaluation.protocol import protocol_for_domain
from tss_opt.evaluation.replay import ReplayError, ReplayEvaluator


def _qa():
    return load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))


def test_protocol_is_frozen_normalised_and_checked():
    p = DecodeProtocol(max_new_tokens=12, eos_token_ids=[2, 7], temperature=0)
    assert p.eos_token_ids == (2, 7) and isinstance(p.temperature, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_new_tokens = 5  # type: ignore[misc]
    assert p.replace(scope="all").scope == "all" and p.scope == "verify"
    with pytest.raises(ValueError, match="max_new_tokens=0 is invalid"):
        DecodeProtocol(max_new_tokens=0)
    assert p.verifier.describe() == "exact" and p.to_dict()["verification"] == "exact"
    assert p.generate_kwargs() == {"max_new_tokens": 12, "scope": "verify", "temperature": 0.0}


def test_protocol_for_domain_takes_the_domains_length_unless_given():
    qa = _qa()
    base = DecodeProtocol(max_new_tokens=5, scope="all")
    p = protocol_for_domain(base, qa)
    assert p.max_new_tokens == qa.config.max_new_tokens and p.system_prompt == qa.config.system_prompt
    assert protocol_for_domain(base, qa, 7).max_new_tokens == 7 and p.scope == "all"


def test_an_evaluator_takes_its_prompt_set_whole(tiny):
    qa = _qa()
    target = TargetModel(tiny.model)
    proto = DecodeProtocol(max_new_tokens=8, scope="all", reuse_prefill=False)
    prompts = PromptSet(qa.split("calibration")[:2], qa.metric, proto)
    ev = SpecDecodeEvaluator(target, tiny.tokenizer, lambda: PromptLookupDrafter(num_tokens=4), prompts, show_progress=False)
    assert ev.protocol == proto and ev.prompts == prompts
    assert ev.max_new_tokens == 8 and ev.scope == "all" and ev.metric_name == qa.metric.name
    a = ev.evaluate([1])
    assert all(0 < p.new_tokens <= 8 for p in a.prompts)
    # on_examples keeps the settings whole and changes the prompts only
    other = ev.on_examples(qa.split("validation")[:1])
    assert other.prompts == prompts.on(qa.split("validation")[:1]) and other.protocol == proto
    with pytest.raises(AttributeError):
        ev.max_new_tokens = 3  # read-only: the protocol is fixed at construction


def test_protocol_engine_equals_the_engine_with_keywords(tiny):
    target = TargetModel(tiny.model)
    ids = format_prompt(tiny.tokenizer, _qa().split("calibration")[0], None)
    proto = DecodeProtocol(max_new_tokens=10, eos_token_ids=(tiny.tokenizer.eos_token_id,))
    via = proto.engine(target, PromptLookupDrafter()).generate(ids, skip=frozenset({1}), **proto.generate_kwargs())
    ref = SpeculativeEngine(target, PromptLookupDrafter(), eos_token_ids=proto.eos_token_ids).generate(
        ids, max_new_tokens=10, skip=frozenset({1}), scope="verify"
    )
    assert torch.equal(via.tokens, ref.tokens)


def test_replay_refuses_a_relaxed_rule_in_the_protocol(tiny):
    qa = _qa()
    args = (TargetModel(tiny.model), tiny.tokenizer, lambda: None)
    prompts = PromptSet(qa.split("calibration")[:1], qa.metric)
    with pytest.raises(ReplayError, match="verification=diversed.*evaluator=engine"):
        ReplayEvaluator(*args, prompts.replace(protocol=DecodeProtocol(verification="diversed")))
    assert ReplayEvaluator(*args, prompts.replace(protocol=DecodeProtocol(max_new_tokens=4))).max_new_tokens == 4


def test_protocols_with_other_rules_differ_and_a_mode_name_becomes_a_verifier():
    from tss_opt.decoding.verify.relaxed import Verifier

    exact, relaxed = DecodeProtocol(), DecodeProtocol(verification="diversed")
    assert isinstance(exact.verification, Verifier) and exact.verification.describe() == "exact"
    assert exact != relaxed and relaxed.verifier.lossy
    assert exact == DecodeProtocol(verification=Verifier())
    assert hash(exact) == hash(relaxed)  # hashable: the (mutable) rule is left out of the hash
