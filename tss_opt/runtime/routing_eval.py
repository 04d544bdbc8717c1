"""How well the domain router sends labelled prompts home: accuracy, fallbacks, confusion.

Used by ``benchmarks/routing.py`` (docs/runtime.md, "Domain routing"); the router itself is
:mod:`tss_opt.runtime.router`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.runtime.router import DomainRouter, RouterError, decide

if TYPE_CHECKING:
    from tss_opt.evaluation.domains import Domain

__all__ = ["RoutingReport", "routing_accuracy"]

log = logging.getLogger(__name__)


@dataclass
class RoutingReport:
    """Routing accuracy on labelled prompts.

    Attributes:
        accuracy: Fraction routed to their own domain (fallbacks to dense count as errors).
        per_domain: Accuracy per true domain.
        fallback_rate: Fraction routed to no domain (dense).
        confusion: ``confusion[true][routed]`` counts; ``routed`` is ``"dense"`` for fallbacks.
        nearest_accuracy: Accuracy of the nearest domain alone (no background, no thresholds).
        total: Prompts routed.
        thresholds: The router's per-domain thresholds.
    """

    accuracy: float
    per_domain: dict[str, float]
    fallback_rate: float
    confusion: dict[str, dict[str, int]]
    nearest_accuracy: float
    total: int
    thresholds: dict[str, float]

    def to_markdown(self) -> str:
        """The confusion matrix as a Markdown table (rows: true domain)."""
        cols = sorted(({c for row in self.confusion.values() for c in row} | set(self.confusion)) - {"dense"}) + ["dense"]
        lines = [
            f"Routing accuracy {self.accuracy:.3f} on {self.total} prompts (fell back to dense: "
            f"{self.fallback_rate:.3f}; nearest domain alone, without background class and thresholds: "
            f"{self.nearest_accuracy:.3f}).",
            "",
            "| true \\ routed | " + " | ".join(cols) + " | accuracy | threshold |",
            "|---|" + "---:|" * (len(cols) + 2),
        ]
        for true in sorted(self.confusion):
            row = self.confusion[true]
            cells = " | ".join(str(row.get(c, 0)) for c in cols)
            thr = self.thresholds.get(true, math.nan)
            lines.append(f"| {true} | {cells} | {self.per_domain[true]:.3f} | {thr:.3f} |")
        return "\n".join(lines)


def routing_accuracy(
    router: DomainRouter,
    tokenizer: Any,
    domains: Sequence[Domain],
    *,
    split: str = "heldout",
    limit: int | None = None,
    progress: bool = True,
) -> RoutingReport:
    """Route each labelled prompt of ``domains``' ``split`` and count how many land home.

    Args:
        router: A fitted router.
        tokenizer: Formats prompts as requests are formatted (chat template).
        domains: The labelled domains.
        split: Which split to route (``heldout``: disjoint from the calibration prompts the
            router was fitted on).
        limit: Prompts per domain (``None``: all).
        progress: Log one line per domain.
    """
    from tss_opt.evaluation.domains import format_prompt

    confusion: dict[str, dict[str, int]] = {}
    hits = nearest_hits = fallbacks = total = 0
    for d in domains:
        examples = d.split(split)  # type: ignore[arg-type]
        if limit is not None:
            examples = examples[:limit]
        row: dict[str, int] = {}
        for ex in examples:
            scores = router.scores(format_prompt(tokenizer, ex, None))
            dec = decide(router, scores)
            key = dec.domain or "dense"
            row[key] = row.get(key, 0) + 1
            hits += dec.domain == d.name
            domain_scores = scores[: len(router.domains)]  # domains come first in classes
            nearest_hits += router.domains[int(torch.argmax(domain_scores))] == d.name
            fallbacks += dec.domain is None
            total += 1
        confusion[d.name] = row
        if progress:
            log.info("routing %s: %d/%d routed home", d.name, row.get(d.name, 0), len(examples))
    if total == 0:
        raise RouterError(f"no prompts to route in split {split!r}")
    return RoutingReport(
        accuracy=hits / total,
        per_domain={d: confusion[d].get(d, 0) / max(1, sum(confusion[d].values())) for d in confusion},
        fallback_rate=fallbacks / total,
        confusion=confusion,
        nearest_accuracy=nearest_hits / total,
        total=total,
        thresholds=dict(router.thresholds),
    )
