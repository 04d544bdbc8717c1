"""What a held-out report holds: one comparison (native vs TSS) per domain.

Plain data shared by the measuring side (:mod:`tss_opt.report.heldout`) and the writing side
(:mod:`tss_opt.report.tables`), so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tss_opt.errors import TSSError

if TYPE_CHECKING:
    from tss_opt.evaluation.evaluator import EvalResult

__all__ = ["DomainComparison", "HeldoutReport", "ReportError"]


class ReportError(TSSError):
    """The report cannot be made as asked; the message names the value and the fix."""


@dataclass
class DomainComparison:
    """One domain's held-out results under both methods.

    Attributes:
        domain: The domain's name.
        metric_name: Its task metric.
        native: The dense target's result (``skip`` empty).
        tss: The mapped skip set's result.
        num_layers: L, for the sparsity column.
        max_new_tokens: Generation length used.
        entry: The mapping entry's JSON form (the calibration measurements of S*).
        plots: Paths of the PNGs made for the domain (``profile``, ``pareto``).
        plot_error: Why plots are missing, if they are.
    """

    domain: str
    metric_name: str
    native: EvalResult
    tss: EvalResult
    num_layers: int
    max_new_tokens: int
    entry: dict[str, Any] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)
    plot_error: str | None = None

    @property
    def speedup(self) -> float:
        """TSS tokens/s over native tokens/s (ratio of the per-prompt means)."""
        return self.tss.tokens_per_s / self.native.tokens_per_s if self.native.tokens_per_s > 0 else float("nan")

    @property
    def num_prompts(self) -> int:
        return len(self.native.prompts)


@dataclass
class HeldoutReport:
    """The whole report: model, drafter, protocol and one comparison per domain."""

    model: str
    num_layers: int
    drafter: str | None
    scope: str
    temperature: float
    mapping_path: str | None
    domains: list[DomainComparison] = field(default_factory=list)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    wall_s: float = 0.0
