"""What a held-out report holds: one comparison (native vs TSS) per domain.

Plain data shared by the measuring side (:mod:`tss_opt.report.heldout`) and the writing side
(:mod:`tss_opt.report.tables`), so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tss_opt.config.enums import Verification
from tss_opt.config.schema import REPORT_LEVEL, REPORT_RESAMPLES
from tss_opt.errors import TSSError
from tss_opt.search.tolerance import MetricTolerance

if TYPE_CHECKING:
    from tss_opt.evaluation.evaluator import EvalResult
    from tss_opt.report.assessment import DomainVerdict, HeldoutStats, ValidationPrediction

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
        tss: The mapped skip set's result; ``None`` when the entry keeps dense (then native
            ran once and nothing is compared).
        num_layers: L, for the sparsity column.
        max_new_tokens: Generation length used.
        entry: The mapping entry's JSON form (the calibration measurements of S*).
        plots: Paths of the PNGs made for the domain (``profile``, ``pareto``).
        plot_error: Why plots are missing, if they are.
        metric_higher_is_better: The metric's direction (for the verdict).
        dense_kept_reason: Why dense is kept (``None`` unless ``tss`` is ``None``).
        stats: The paired intervals (``None`` when dense is kept).
        prediction: The validation figures of S* from the mapping entry, if any.
        verdict: The held-out goal (``tss_opt.report.assessment``) judged on this domain.
        verification: The TSS row's acceptance rule: ``exact``, or the mapping entry's lossy
            rule (``diversed(...)``, ``cospec(...)``), under which it was measured.
    """

    domain: str
    metric_name: str
    native: EvalResult
    tss: EvalResult | None
    num_layers: int
    max_new_tokens: int
    entry: dict[str, Any] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)
    plot_error: str | None = None
    metric_higher_is_better: bool = True
    dense_kept_reason: str | None = None
    stats: HeldoutStats | None = None
    prediction: ValidationPrediction | None = None
    verdict: DomainVerdict | None = None
    verification: str = "exact"

    @property
    def lossy(self) -> bool:
        """The TSS row ran a relaxed (lossy) rule: its output is not the target's own."""
        return self.tss is not None and Verification.lossy_label(self.verification)

    @property
    def metric_change(self) -> float:
        """TSS metric minus native's (0.0 when dense is kept); shown beside a lossy row's speedup."""
        return 0.0 if self.tss is None else self.tss.metric - self.native.metric

    @property
    def dense_kept(self) -> bool:
        """The mapping keeps dense for this domain: only native was measured."""
        return self.tss is None

    @property
    def speedup(self) -> float:
        """TSS tokens/s over native tokens/s (ratio of the per-prompt means); 1.0 when dense
        is kept (the runtime runs dense)."""
        if self.tss is None:
            return 1.0
        return self.tss.tokens_per_s / self.native.tokens_per_s if self.native.tokens_per_s > 0 else float("nan")

    @property
    def num_prompts(self) -> int:
        return len(self.native.prompts)


@dataclass
class HeldoutReport:
    """The whole report: model, drafter, protocol and one comparison per domain.

    ``level``, ``resamples`` and ``seed`` are the intervals' (two-sided coverage, bootstrap
    resamples and seed, :mod:`tss_opt.report.intervals`); ``tolerance`` the metric tolerance
    of the verdict (:mod:`tss_opt.report.assessment`; the search's, from its settings).
    """

    model: str
    num_layers: int
    drafter: str | None
    scope: str
    temperature: float
    mapping_path: str | None
    domains: list[DomainComparison] = field(default_factory=list)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    wall_s: float = 0.0
    level: float = REPORT_LEVEL
    resamples: int = REPORT_RESAMPLES
    seed: int = 0
    tolerance: MetricTolerance = field(default_factory=MetricTolerance)
    plots: dict[str, str] = field(default_factory=dict)  # report-wide figures (``speedup``)
