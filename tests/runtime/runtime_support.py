"""Helpers shared by the runtime and report tests (imported by name, not fixtures)."""

from __future__ import annotations

from typing import Any

from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter

TINY_ID = "tiny-llama-4l-seed0"


def pld() -> PromptLookupDrafter:
    """The drafter of every test: prompt lookup, short chains."""
    return PromptLookupDrafter(num_tokens=4, max_ngram=2, min_ngram=1)


def mapping_data(
    skips: dict[str, list[int]], model: str = TINY_ID, num_layers: int = 4, scopes: dict[str, str] | None = None
) -> dict[str, Any]:
    """A valid mapping document with one entry per domain (made-up measurements); ``scopes``
    gives some entries a skip scope (the others have none: read as ``verify``)."""
    data = {
        "format": 1,
        "model": model,
        "num_layers": num_layers,
        "domains": {
            d: {
                "skip_set": s,
                "accept_length": 2.0,
                "metric": 0.5,
                "metric_name": "token_f1",
                "cost": 0.3,
                "sparsity": len(s) / num_layers,
                "baseline": {"accept_length": 1.8, "metric": 0.5, "cost": 0.55},
                "model": model,
                "num_layers": num_layers,
                "drafter": "pld",
                "split": "calibration",
                "study": {"name": f"{d}.study", "storage": "sqlite:///nowhere.db"},
                "selection": "min_cost",
                "alternatives": [],
            }
            for d, s in skips.items()
        },
    }
    for d, scope in (scopes or {}).items():
        data["domains"][d]["scope"] = scope
    return data
