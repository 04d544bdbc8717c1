"""Verification cost of a skip set: analytic (deterministic) and measured (seconds)."""

from __future__ import annotations

from tss_opt.config.enums import Cost

COSTS = tuple(c.value for c in Cost)


def analytic_cost(num_layers: int, skipped: int, accept_length: float) -> float:
    """Relative target compute per committed token: ``(active layers / L) / A``.

    Deterministic and hardware-independent, so trial rankings do not move with machine
    noise; dense decoding without a drafter costs exactly 1.0.
    """
    return ((num_layers - skipped) / num_layers) / max(accept_length, 1e-9)


def measured_cost(verify_seconds: float, committed_tokens: int) -> float:
    """Target verification seconds per committed token (wall clock: noisy on shared machines)."""
    return verify_seconds / max(committed_tokens, 1)
