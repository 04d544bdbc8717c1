"""Speculative decoding with a skippable target: prefill, draft, verify, accept, roll back.

The drafter contract (:class:`Drafter`) sits beside the tree it produces (:class:`DraftTree`);
the drafters themselves live in the subpackage :mod:`tss_opt.decoding.drafters`,
which imports this package and is never imported by it (no cycle): build drafters with
:func:`tss_opt.decoding.drafters.build_drafter`. Verification rules, exact and relaxed, are in
:mod:`tss_opt.decoding.verify`.
"""

from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, VerifyFeedback
from tss_opt.decoding.engine import (
    SCOPES,
    GenerationResult,
    NoDrafter,
    SpeculativeEngine,
)
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.skip import SkipController, SkipError, validate_skip
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import ContextLengthError, TargetModel
from tss_opt.decoding.tree import ROOT, DraftTree

__all__ = [
    "ROOT",
    "SCOPES",
    "ContextLengthError",
    "DecodeProtocol",
    "DecodeStats",
    "DraftTree",
    "Drafter",
    "DrafterCapabilities",
    "GenerationResult",
    "NoDrafter",
    "SkipController",
    "SkipError",
    "SpeculativeEngine",
    "TargetModel",
    "VerifyFeedback",
    "validate_skip",
]

