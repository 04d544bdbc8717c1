"""Speculative decoding with a skippable target: prefill, draft, verify, accept, roll back.

The drafter contract (:class:`Drafter`) sits beside the tree it produces (:class:`DraftTree`);
the drafters themselves live in the subpackage :mod:`tss_opt.evaluation.decoding.drafters`,
which imports this package and is never imported by it (no cycle).
"""

from tss_opt.evaluation.decoding.drafter import Drafter, VerifyFeedback
from tss_opt.evaluation.decoding.engine import (
    SCOPES,
    GenerationResult,
    NoDrafter,
    SpeculativeEngine,
)
from tss_opt.evaluation.decoding.skip import SkipController, SkipError, validate_skip
from tss_opt.evaluation.decoding.stats import DecodeStats
from tss_opt.evaluation.decoding.target import ContextLengthError, TargetModel
from tss_opt.evaluation.decoding.tree import ROOT, DraftTree

__all__ = [
    "ROOT",
    "SCOPES",
    "ContextLengthError",
    "DecodeStats",
    "DraftTree",
    "Drafter",
    "GenerationResult",
    "NoDrafter",
    "SkipController",
    "SkipError",
    "SpeculativeEngine",
    "TargetModel",
    "VerifyFeedback",
    "validate_skip",
]
