"""What a search's figures measured, for the tables that show them.

Every figure in a table says what it measured. The search summary printed by
``python -m tss_opt`` and the dashboard note (:mod:`tss_opt.search.note`) take their columns
and caption from :func:`figures_of`:

- ``evaluator=engine``: speculative decoding ran and was timed, so a ``tok/s (engine)`` column
  is shown (mean over prompts of tokens / decoding wall time, on this machine, as loaded);
- ``evaluator=replay`` (the default on a CPU in float32): the sparse target's greedy outputs
  were generated in batches and the drafter replayed over them. Accepted length and metric
  equal the engine's; nothing was decoded, so **no speed column**: the cost (analytic: target
  layers run per committed token, dense decoding without a drafter = 1) is the figure to rank
  by, and a measured speed comes from the held-out report (``python -m tss_opt.cli.report``) or
  ``evaluator=engine``. The replay's own throughput is kept as the trial attribute
  ``replay_tokens_per_s`` and is not shown;
- another evaluator (a user's callable): its ``tokens_per_s``, if it reports one, shown as
  ``tok/s (as reported)``.

Which evaluator ran is read from the dense trial's ``evaluator`` attribute (written by the
shipped evaluators); studies recorded before it existed show as "not recorded".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Figures", "figures_of"]


@dataclass(frozen=True)
class Figures:
    """How to show one search's figures.

    Attributes:
        evaluator: ``"engine"``, ``"replay"``, or ``None`` (not recorded: an older study or a
            user's evaluator).
        speed_key: The trial attribute of a speed column (``"tokens_per_s"``), or ``None``: no
            speed column.
        speed_header: The speed column's header (``""`` without one).
        cost_header: The cost column's header, naming the cost (``cost (analytic)``).
        caption: One line under the table saying what the figures are.
    """

    evaluator: str | None
    speed_key: str | None
    speed_header: str
    cost_header: str
    caption: str

    def speed_cell(self, values: Mapping[str, Any], fmt: str = ".2f", missing: str = "—") -> str:
        """The speed column's cell of one configuration (``missing`` when it has none)."""
        v = values.get(self.speed_key) if self.speed_key else None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            return missing
        return format(float(v), fmt)


def figures_of(baseline: Mapping[str, Any]) -> Figures:
    """The columns and caption for a search whose dense trial recorded ``baseline``."""
    kind = baseline.get("evaluator")
    kind = str(kind) if isinstance(kind, str) and kind else None
    cost_kind = baseline.get("cost_kind")
    cost_header = f"cost ({cost_kind})" if isinstance(cost_kind, str) and cost_kind else "cost"
    if kind == "replay":
        return Figures(
            kind, None, "", cost_header,
            "figures: evaluator=replay (the sparse target's greedy outputs, the drafter replayed over "
            "them): accepted length and metric are the engine's; no decoding was timed, so no tok/s is "
            "shown. cost: target layers run per committed token (dense decoding without a drafter = 1). "
            "Measured speed: python -m tss_opt.cli.report (held-out) or evaluator=engine.",
        )
    if kind == "engine":
        return Figures(
            kind, "tokens_per_s", "tok/s (engine)", cost_header,
            "figures: evaluator=engine (speculative decoding run and timed on this machine): tok/s is "
            "the mean over prompts of generated tokens / decoding wall time (noisy on a shared machine).",
        )
    if "tokens_per_s" in baseline:
        return Figures(
            kind, "tokens_per_s", "tok/s (as reported)", cost_header,
            "figures: as the evaluator reported them (which evaluator is not recorded; tok/s is its "
            "tokens_per_s, a decoding speed only if it timed decoding).",
        )
    return Figures(kind, None, "", cost_header, "figures: as the evaluator reported them (no tok/s recorded).")
