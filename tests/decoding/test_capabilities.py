"""Drafter capabilities: declared once on the drafter, read by everyone."""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding import DrafterCapabilities, NoDrafter
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.drafters import (
    DraftModelDrafter,
    EagleDrafter,
    PromptLookupDrafter,
    SamdDrafter,
    SelfDrafter,
    TokenRecycleDrafter,
)
from tss_opt.decoding.drafters.registry import distribution_drafters, drafter_capabilities
from tss_opt.decoding.drafters.taps import RoutedDrafter
from tss_opt.decoding.tree import DraftTree
from tss_opt.decoding.verify.relaxed import (
    RelaxedVerificationError,
    Verifier,
)
from tss_opt.evaluation.replay import ReplayError, check_replayable


class _Empty(Drafter):
    def propose(self, context: torch.Tensor) -> DraftTree:
        return DraftTree.empty()


def test_each_shipped_class_declares_its_capabilities():
    assert DraftModelDrafter.capabilities == DrafterCapabilities(distribution=True, confidence=True, replayable=True)
    assert SelfDrafter.capabilities.distribution and SelfDrafter.capabilities.replayable
    assert EagleDrafter.capabilities == DrafterCapabilities(
        distribution=True, confidence=True, prefill_feedback=True, replayable=True
    )
    assert PromptLookupDrafter.capabilities == DrafterCapabilities(confidence=True, replayable=True)
    tr = TokenRecycleDrafter.capabilities
    assert tr.prefill_feedback and tr.confidence and not tr.replayable and "Token Recycling" in tr.replay_refusal
    assert NoDrafter.capabilities.replayable and not _Empty.capabilities.replayable


def test_capabilities_have_one_spelling():
    # The former flags (gives_distribution, gives_confidence, needs_prefill_feedback) are gone:
    # a class declares capabilities, an instance may replace its own (TAPS, SAMD).
    for flag in ("gives_distribution", "gives_confidence", "needs_prefill_feedback"):
        assert not hasattr(_Empty(), flag)
    d = _Empty()
    d.capabilities = DrafterCapabilities(confidence=True)
    assert d.capabilities.confidence and not _Empty.capabilities.confidence


def test_composed_drafters_take_their_parts_capabilities():
    assert SamdDrafter(fallback=NoDrafter()).capabilities.replayable
    samd = SamdDrafter()  # Token Recycling fallback
    assert samd.capabilities.prefill_feedback and not samd.capabilities.replayable
    routed = RoutedDrafter([("pld", PromptLookupDrafter()), ("tr", TokenRecycleDrafter())])
    assert routed.capabilities.confidence and routed.capabilities.prefill_feedback
    assert not routed.capabilities.distribution


def test_replay_reads_the_capability():
    check_replayable(None)
    check_replayable(PromptLookupDrafter())

    class Declared(_Empty):
        capabilities = DrafterCapabilities(replayable=True)

    check_replayable(Declared())
    with pytest.raises(ReplayError, match="does not know whether drafter _Empty can be replayed"):
        check_replayable(_Empty())
    with pytest.raises(ReplayError, match="SAMD's Token Recycling fallback"):
        check_replayable(SamdDrafter())


def test_config_time_capabilities_come_from_the_builders_class():
    assert drafter_capabilities({"name": "pld"}) == PromptLookupDrafter.capabilities
    assert drafter_capabilities({"name": "t2d"}) == DraftModelDrafter.capabilities
    assert drafter_capabilities({"_target_": "tss_opt.decoding.drafters.eagle.build_eagle"}).distribution
    assert drafter_capabilities({"_target_": "builtins.print"}) is None  # an unmarked builder
    assert distribution_drafters() == ["draft_model", "eagle", "self", "t2d"]


def test_relaxed_verification_reads_the_capability():
    Verifier(mode="diversed").prepare(DraftModelDrafter.__new__(DraftModelDrafter))
    with pytest.raises(RelaxedVerificationError, match="'PromptLookupDrafter' gives none.*distribution_drafters"):
        Verifier(mode="diversed").prepare(PromptLookupDrafter())


def test_assembly_refuses_a_relaxed_rule_for_a_drafter_without_distribution():
    from tss_opt.assembly import check_distribution_drafter

    check_distribution_drafter("diversed", {"name": "eagle"})
    check_distribution_drafter("diversed", {"name": "x", "_target_": "tss_opt.decoding.drafters.draft_model.build_self"})
    for cfg in ({"name": "pld"}, {"name": "samd"}, {"name": "routed"}, {"name": "mine", "_target_": "builtins.print"}):
        with pytest.raises(RelaxedVerificationError, match="gives none; use one of: draft_model, eagle, self, t2d"):
            check_distribution_drafter("diversed", cfg)
