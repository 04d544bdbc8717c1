"""Speculative decoding with a skippable target: prefill, draft, verify, accept, roll back.

Names are re-exported lazily: ``drafters.base`` imports ``decoding.tree`` while the engine
imports ``drafters.base``; eager imports here would make that a cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SCOPES": "engine",
    "GenerationResult": "engine",
    "NoDrafter": "engine",
    "SpeculativeEngine": "engine",
    "SkipController": "skip",
    "SkipError": "skip",
    "validate_skip": "skip",
    "DecodeStats": "stats",
    "ContextLengthError": "target",
    "TargetModel": "target",
    "ROOT": "tree",
    "DraftTree": "tree",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
