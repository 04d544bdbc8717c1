"""Drafters: everything that proposes candidate tokens to the target."""

from tss_opt.evaluation.drafters.base import Drafter, VerifyFeedback
from tss_opt.evaluation.drafters.draft_model import DraftModelDrafter, SelfDrafter
from tss_opt.evaluation.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["DraftModelDrafter", "Drafter", "PromptLookupDrafter", "SelfDrafter", "VerifyFeedback"]
