"""The study protocol: one frozen value whose fields declare how they enter the identity."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from tss_opt.config.identity import identity_field, identity_of
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.evaluation.protocol import StudyProtocol
from tss_opt.search.identity import protocol_hash


def _default(**changes) -> StudyProtocol:
    return dataclasses.replace(StudyProtocol(decode=DecodeProtocol(max_new_tokens=24), prompts=16), **changes)


def test_the_identity_holds_the_declared_fields_and_omits_former_values():
    assert _default().identity() == {
        "max_new_tokens": 24, "scope": "verify", "temperature": 0.0, "cost": "analytic",
        "prompts": 16, "split": "calibration", "dtype": "float32",
    }
    on = _default(compile=True, verification="diversed(w=0.6)", evaluator="build_replay_evaluator").identity()
    assert on["compile"] is True and on["verification"] == "diversed(w=0.6)"
    assert on["evaluator"] == "build_replay_evaluator"
    # What does not change a token stays out: stop tokens, the system prompt, prefill reuse.
    quiet = _default(decode=DecodeProtocol(max_new_tokens=24, eos_token_ids=(2,), system_prompt="Be brief.",
                                           reuse_prefill=False))
    assert quiet.identity() == _default().identity()
    assert protocol_hash(_default(decode=DecodeProtocol(max_new_tokens=25)).identity()) != protocol_hash(
        _default().identity()
    )


def test_a_new_setting_is_one_field_declaration():
    @dataclass(frozen=True)
    class WithTopP(StudyProtocol):
        top_p: float = identity_field(1.0, omitted=1.0)

    base = WithTopP(decode=DecodeProtocol(max_new_tokens=24), prompts=16)
    assert base.identity() == _default().identity()  # the former value adds no key: names kept
    assert dataclasses.replace(base, top_p=0.9).identity() == {**_default().identity(), "top_p": 0.9}


def test_two_fields_cannot_claim_one_key():
    @dataclass(frozen=True)
    class Clash:
        decode: DecodeProtocol = identity_field(DecodeProtocol(), nested=True)
        length: int = identity_field(8, key="max_new_tokens")

    with pytest.raises(ValueError, match="max_new_tokens declared twice in Clash"):
        identity_of(Clash())
