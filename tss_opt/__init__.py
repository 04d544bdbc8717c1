"""tss_opt: target-side sparsification (TSS) for speculative decoding, searched as Optuna trials.

Entry points: :func:`run_search` (search any evaluator's skip sets, several processes
cooperating through one SQL storage) and the commands under :mod:`tss_opt.cli`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["SearchResult", "run_search"]


def __getattr__(name: str) -> Any:
    # Lazy: `import tss_opt` stays cheap for the commands that only need part of it.
    if name in __all__:
        from tss_opt import search

        return getattr(search, name)
    raise AttributeError(f"module 'tss_opt' has no attribute {name!r}")
