"""Drafters: propose draft trees for the target to verify (chains are one-branch trees)."""

from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, VerifyFeedback
from tss_opt.decoding.drafters.draft_model import DraftModelDrafter, SelfDrafter
from tss_opt.decoding.drafters.eagle import (
    EagleDrafter,
    EagleHead,
    EagleHeadError,
    load_eagle_head,
    random_eagle_head,
    save_eagle_head,
)
from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
from tss_opt.decoding.drafters.registry import (
    DrafterConfigError,
    available_drafters,
    build_drafter,
)
from tss_opt.decoding.drafters.sam import SamdDrafter, SuffixAutomaton
from tss_opt.decoding.drafters.token_recycle import AdjacencyTable, TokenRecycleDrafter
from tss_opt.decoding.templates import (
    TemplateError,
    TreeTemplate,
    load_template,
)

__all__ = [
    "AdjacencyTable",
    "DraftModelDrafter",
    "Drafter",
    "DrafterCapabilities",
    "DrafterConfigError",
    "EagleDrafter",
    "EagleHead",
    "EagleHeadError",
    "PromptLookupDrafter",
    "SamdDrafter",
    "SelfDrafter",
    "SuffixAutomaton",
    "TemplateError",
    "TokenRecycleDrafter",
    "TreeTemplate",
    "VerifyFeedback",
    "available_drafters",
    "build_drafter",
    "load_eagle_head",
    "load_template",
    "random_eagle_head",
    "save_eagle_head",
]
