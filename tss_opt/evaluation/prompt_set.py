"""What a trial evaluator runs: its prompts, how it decodes them and how it scores them.

Every trial evaluator (the engine's, the replay) is built from the loaded model and one
:class:`PromptSet`; rebuilding one on other prompts (validation) changes only the examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tss_opt.decoding.protocol import DecodeProtocol

if TYPE_CHECKING:
    from tss_opt.evaluation.domain_data import Example
    from tss_opt.evaluation.domains import Domain
    from tss_opt.evaluation.metrics import Metric

__all__ = ["PromptSet"]


@dataclass(frozen=True)
class PromptSet:
    """The prompts of a trial evaluator and their settings, as one value.

    Attributes:
        examples: the prompts, in evaluation order (``prompt_ids`` index them).
        metric: the objective metric; ``extra_metrics`` are reported beside it.
        protocol: how every prompt is decoded (length, scope, temperature, cost, stop
            tokens, system prompt, prefill reuse, acceptance rule).
    """

    examples: tuple[Example, ...]
    metric: Metric
    protocol: DecodeProtocol = field(default_factory=DecodeProtocol)
    extra_metrics: tuple[Metric, ...] = ()

    def __post_init__(self) -> None:
        # Callers pass lists (a domain's split, a slice of it); the value stays immutable.
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "extra_metrics", tuple(self.extra_metrics))

    @classmethod
    def of(cls, domain: Domain, examples: Sequence[Example], protocol: DecodeProtocol) -> PromptSet:
        """``examples`` of ``domain`` scored by the domain's metrics."""
        return cls(tuple(examples), domain.metric, protocol, tuple(domain.extra_metrics))

    def on(self, examples: Sequence[Example]) -> PromptSet:
        """The same settings on other prompts."""
        return dataclasses.replace(self, examples=tuple(examples))

    def replace(self, **changes: Any) -> PromptSet:
        """A copy with ``changes`` applied (fields as keywords)."""
        return dataclasses.replace(self, **changes)
