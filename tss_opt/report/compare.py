"""Strategy comparison (the paper's Table 2) and tolerance sweep (Table 4): rows, tables, plot.

A row is one search (one strategy, or one tolerance) on one domain: its chosen skip set, the
calibration measurements of that set (from its trial), its held-out measurements (measured by
the command), and what the search spent (evaluations, generated tokens). The plot draws each
strategy's best feasible cost against evaluations spent (in evaluation order).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC
from tss_opt.report.tables import format_skip_set

if TYPE_CHECKING:
    from tss_opt.search import SearchResult

__all__ = [
    "ComparisonRow",
    "best_cost_curve",
    "comparison_markdown",
    "plot_best_cost",
    "row_from_result",
    "sweep_markdown",
    "write_rows",
]


@dataclass
class ComparisonRow:
    """One search's line in the comparison or sweep table.

    Attributes:
        label: The strategy (compare) or the tolerance, e.g. ``-5%`` (sweep).
        study_name: The search's study.
        skip_set: S* (sorted).
        sparsity: |S*| / L.
        calibration: ``accept_length``, ``metric``, ``tokens_per_s`` of S* on the calibration
            prompts (its trial).
        heldout: The same on the held-out prompts (empty when not measured).
        evaluations: Skip sets evaluated by the search (baseline included).
        generated_tokens: Tokens generated over all those evaluations.
        stop_reason: Why the search stopped.
        curve: ``(evaluations, best feasible cost so far)`` after each evaluation.
        settings: Extra settings shown in the JSON (eps/tau of a sweep row).
    """

    label: str
    study_name: str
    skip_set: list[int]
    sparsity: float
    calibration: dict[str, float | None]
    heldout: dict[str, float | None] = field(default_factory=dict)
    evaluations: int = 0
    generated_tokens: int = 0
    stop_reason: str = ""
    curve: list[tuple[int, float | None]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def best_cost_curve(result: SearchResult) -> list[tuple[int, float | None]]:
    """Best feasible cost after each evaluation, in trial (evaluation) order."""
    done = sorted((r for r in result.trials if r.number >= 0), key=lambda r: r.number)
    best: float | None = None
    out = []
    for n, r in enumerate(done, start=1):
        if r.feasible and r.cost is not None:
            best = r.cost if best is None else min(best, r.cost)
        out.append((n, best))
    return out


def _measures(values: Mapping[str, Any]) -> dict[str, float | None]:
    def get(k: str) -> float | None:
        v = values.get(k)
        return float(v) if isinstance(v, (int, float)) else None

    return {ACCEPT_LENGTH: get(ACCEPT_LENGTH), METRIC: get(METRIC), "tokens_per_s": get("tokens_per_s")}


def row_from_result(label: str, result: SearchResult) -> ComparisonRow:
    """The calibration part of a row, from a finished search."""
    best = result.best_record
    tokens = sum(int(r.values.get("new_tokens") or 0) for r in result.trials if not r.failed)
    return ComparisonRow(
        label=label,
        study_name=result.study_name,
        skip_set=sorted(result.best),
        sparsity=len(result.best) / result.num_layers,
        calibration=_measures(best.values),
        evaluations=len(result.trials),
        generated_tokens=tokens,
        stop_reason=result.stop_reason,
        curve=best_cost_curve(result),
    )


def _f(v: float | None, digits: int) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def comparison_markdown(
    rows: Sequence[ComparisonRow], *, metric_name: str, domain: str, dense: ComparisonRow | None = None
) -> str:
    """The paper's Table 2 layout: per strategy, calibration and held-out A / M / tok/s."""
    m = metric_name
    lines = [
        f"Domain **{domain}**: the chosen skip set of each strategy; calibration (cal) = the "
        "search's prompts, held-out (ho) = disjoint prompts.",
        "",
        f"| strategy | skip set | cal accepted length | cal {m} | cal tok/s | ho accepted length | "
        f"ho {m} | ho tok/s | evaluations | generated tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ([dense] if dense else []) + list(rows):
        c, h = r.calibration, r.heldout
        lines.append(
            f"| {r.label} | {format_skip_set(r.skip_set)} | {_f(c.get(ACCEPT_LENGTH), 3)} | "
            f"{_f(c.get(METRIC), 4)} | {_f(c.get('tokens_per_s'), 2)} | {_f(h.get(ACCEPT_LENGTH), 3)} | "
            f"{_f(h.get(METRIC), 4)} | {_f(h.get('tokens_per_s'), 2)} | {r.evaluations or '–'} | "
            f"{r.generated_tokens or '–'} |"
        )
    return "\n".join(lines)


def sweep_markdown(rows: Sequence[ComparisonRow], *, metric_name: str, domain: str) -> str:
    """The paper's Table 4 layout: per tolerance, S*, sparsity, A, M, tok/s, evaluations."""
    m = metric_name
    lines = [
        f"Domain **{domain}**: eps = tau per row (the paper's sign: -5% allows a 5% drop, +5% "
        "requires a 5% gain); calibration measurements of S*, held-out in parentheses.",
        "",
        f"| eps = tau | skip set | sparsity | accepted length | {m} | tok/s | evaluations |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, h = r.calibration, r.heldout

        def both(k: str, d: int, c: dict = c, h: dict = h) -> str:
            ho = f" ({_f(h.get(k), d)})" if h else ""
            return f"{_f(c.get(k), d)}{ho}"

        lines.append(
            f"| {r.label} | {format_skip_set(r.skip_set)} | {r.sparsity:.1%} | {both(ACCEPT_LENGTH, 3)} | "
            f"{both(METRIC, 4)} | {both('tokens_per_s', 2)} | {r.evaluations} |"
        )
    return "\n".join(lines)


def plot_best_cost(
    rows: Sequence[ComparisonRow], path: str | os.PathLike[str], *, title: str, dense_cost: float | None = None
) -> Path:
    """Each row's best feasible cost against evaluations spent (step lines, Agg canvas)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), layout="constrained")
    ax = fig.subplots()
    for r in rows:
        pts = [(n, c) for n, c in r.curve if c is not None]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        ax.step(xs, ys, where="post", label=f"{r.label} ({r.evaluations} evals)", linewidth=1.5)
        ax.plot([xs[-1]], [ys[-1]], marker="o", markersize=4, color=ax.lines[-1].get_color())
    if dense_cost is not None:
        ax.axhline(dense_cost, color="black", linestyle="--", linewidth=0.8, label="dense")
    ax.set_xlabel("evaluations spent (skip sets measured, dense included)")
    ax.set_ylabel("best feasible cost so far (lower is cheaper)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title, fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def write_rows(
    rows: Sequence[ComparisonRow], markdown: str, out_dir: str | os.PathLike[str], stem: str,
    meta: Mapping[str, Any],
) -> dict[str, Path]:
    """``<stem>.md`` and ``<stem>.json`` (rows + ``meta``) into ``out_dir``."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    md = d / f"{stem}.md"
    md.write_text(markdown + "\n")
    js = d / f"{stem}.json"
    js.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    return {"markdown": md, "json": js}
