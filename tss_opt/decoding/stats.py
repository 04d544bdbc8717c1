"""Per-request decoding statistics (Spec-Bench conventions)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tss_opt.config.enums import Verification


@dataclass
class DecodeStats:
    """What one request cost and achieved.

    ``accept_length`` follows Spec-Bench: tokens committed by verification steps divided by
    verification steps, the target's bonus/correction token included, so decoding without a
    drafter gives exactly 1.0. The first token (from the prefill) belongs to no step.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0  # every generated token, the prefill's first one included
    steps: int = 0  # verification forwards
    step_tokens: int = 0  # tokens committed by those steps (after truncation at EOS/max)
    draft_proposed: int = 0  # candidate tokens (tree nodes) sent to verification
    draft_accepted: int = 0  # candidates accepted (bonus tokens excluded)
    num_layers: int = 0
    skipped_layers: int = 0
    prefill_layer_forwards: int = 0  # decoder-layer forwards run by the prefill
    verify_layer_forwards: int = 0  # decoder-layer forwards run by verification steps
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    # The acceptance rule (Verifier.describe()): "exact", or a lossy relaxed rule such as
    # "diversed(w=0.60)" / "cospec(threshold)" whose output may differ from the target's.
    verification: str = "exact"
    relaxed_accepted: int = 0  # draft tokens accepted only by the relaxed rule (0 when exact)

    @property
    def lossy(self) -> bool:
        """True when a relaxed (lossy) verification rule produced this request."""
        return Verification.lossy_label(self.verification)

    @property
    def accept_length(self) -> float:
        return self.step_tokens / self.steps if self.steps else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.draft_accepted / self.draft_proposed if self.draft_proposed else 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = asdict(self)
        d.update(
            lossy=self.lossy,
            accept_length=self.accept_length,
            tokens_per_s=self.tokens_per_s,
            draft_acceptance_rate=self.draft_acceptance_rate,
        )
        return d
