"""Speculative decoding with a skippable target: prefill, draft, verify, accept, roll back."""

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
    "GenerationResult",
    "NoDrafter",
    "SkipController",
    "SkipError",
    "SpeculativeEngine",
    "TargetModel",
    "validate_skip",
]
