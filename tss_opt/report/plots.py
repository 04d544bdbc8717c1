"""Figures of a domain's search study (PNG, drawn with matplotlib's Agg canvas).

- :func:`plot_single_layer_profile`: level 1 of the search, the change in accepted length and
  in the task metric when each single layer is skipped, against the dense baseline (the
  paper's Figure 3: two bar panels sharing the layer axis).
- :func:`plot_pareto`: every evaluated skip set as accepted length against metric, coloured by
  cost; feasible and infeasible sets have different markers, the Pareto set is ringed and the
  selected S* is annotated.
- :func:`plot_speedup`: the held-out report's speedup per domain with its interval bars
  (dense-kept domains drawn at 1.0 without a bar).

Both take a :class:`tss_opt.search.SearchResult` (``tss_opt.search.load_result`` rebuilds one
from the storage) and use ``matplotlib.figure.Figure`` directly, so pyplot's global state and
backend are never touched.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC
from tss_opt.errors import TSSError
from tss_opt.report.tables import format_skip_set

if TYPE_CHECKING:
    from tss_opt.report.results import HeldoutReport
    from tss_opt.search import SearchResult, TrialRecord

__all__ = ["PlotError", "plot_pareto", "plot_single_layer_profile", "plot_speedup"]

UP, DOWN, NEUTRAL = "#2b83ba", "#d7191c", "#9e9e9e"


class PlotError(TSSError):
    """The study lacks what a plot needs (e.g. level 1 never ran)."""


def _measured(result: SearchResult) -> list[TrialRecord]:
    return [r for r in result.trials if not r.failed and r.accept_length is not None and r.metric is not None]


def _baseline(result: SearchResult) -> tuple[float, float]:
    b = result.baseline
    if not b or ACCEPT_LENGTH not in b or METRIC not in b:
        raise PlotError(f"study '{result.study_name}' has no dense baseline measurement; run its search first")
    return float(b[ACCEPT_LENGTH]), float(b[METRIC])


def plot_single_layer_profile(
    result: SearchResult,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    selected: Iterable[int] | None = None,
) -> Path:
    """Two bar panels over the layers: ΔA({l}) = A({l}) - A0 and ΔM({l}) = M({l}) - M0.

    Layers the search did not evaluate alone (barriers) are marked "n/e"; layers of the
    candidate pool are drawn solid, the others faded; layers of S* get a star.

    Args:
        result: The study's result.
        path: Output PNG.
        title: Figure title (default: the study name).
        selected: S* to mark (default: ``result.best``).

    Raises:
        PlotError: No baseline or no level-1 measurement.
    """
    from matplotlib.figure import Figure

    A0, M0 = _baseline(result)
    singles = {next(iter(r.skip_set)): r for r in _measured(result) if r.level == 1}
    if not singles:
        raise PlotError(f"study '{result.study_name}' has no single-layer (level 1) measurements to plot")
    L = result.num_layers
    pool = set(result.pool)
    chosen = set(result.best if selected is None else selected)
    layers = list(range(L))
    panels = (
        ("accepted length", [singles[i].accept_length - A0 if i in singles else math.nan for i in layers], A0),
        (result.metric_name, [singles[i].metric - M0 if i in singles else math.nan for i in layers], M0),
    )
    fig = Figure(figsize=(max(8.0, 0.32 * L + 3), 6.2), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (name, deltas, base) in zip(axes, panels, strict=True):
        colors = [NEUTRAL if math.isnan(d) else (UP if d >= 0 else DOWN) for d in deltas]
        alphas = [1.0 if (not pool or i in pool) else 0.45 for i in layers]
        heights = [0.0 if math.isnan(d) else d for d in deltas]
        bars = ax.bar(layers, heights, color=colors, edgecolor="black", linewidth=0.4)
        for bar, a in zip(bars, alphas, strict=True):
            bar.set_alpha(a)
        ax.axhline(0.0, color="black", linewidth=0.8)
        finite = [d for d in deltas if not math.isnan(d)]
        span = max((abs(d) for d in finite), default=1.0) or 1.0
        for i, d in zip(layers, deltas, strict=True):
            if math.isnan(d):
                ax.text(i, 0.02 * span, "n/e", ha="center", va="bottom", fontsize=6, color=NEUTRAL, rotation=90)
            elif i in chosen:
                ax.plot([i], [d + (0.06 if d >= 0 else -0.06) * span], marker="*", color="gold", markeredgecolor="black", markersize=10)
        ax.set_ylabel(f"Δ {name}\n(dense = {base:.3f})")
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xlabel("skipped layer l  (faded: outside the candidate pool; ★: in S*; n/e: not evaluated)")
    axes[-1].set_xticks(layers)
    axes[-1].tick_params(axis="x", labelsize=7)
    fig.suptitle(title or f"Single-layer skip profile — {result.study_name}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def plot_pareto(
    result: SearchResult,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    selected: Iterable[int] | None = None,
) -> Path:
    """Accepted length (x) against metric (y) of every evaluated skip set.

    Colour: cost (colour bar). Marker: circle feasible, cross infeasible; the dense baseline
    is a black square with dashed guide lines; Pareto points are ringed in red; S* is annotated.

    Args:
        result: The study's result.
        path: Output PNG.
        title: Figure title (default: the study name).
        selected: S* to annotate (default: ``result.best``).

    Raises:
        PlotError: No baseline measurement.
    """
    from matplotlib.figure import Figure

    A0, M0 = _baseline(result)
    records = [r for r in _measured(result) if r.cost is not None]
    costs = [float(r.cost) for r in records]  # type: ignore[arg-type]
    vmin, vmax = (min(costs), max(costs)) if costs else (0.0, 1.0)
    if vmin == vmax:
        vmax = vmin + 1e-9
    chosen = frozenset(result.best if selected is None else selected)
    pareto = set(result.pareto)

    fig = Figure(figsize=(8.0, 6.0), layout="constrained")
    ax = fig.subplots()
    ax.axvline(A0, color="black", linestyle="--", linewidth=0.7, alpha=0.6)
    ax.axhline(M0, color="black", linestyle="--", linewidth=0.7, alpha=0.6)
    scatter = None
    for feasible, marker, label in ((True, "o", "feasible"), (False, "X", "infeasible")):
        group = [r for r in records if r.feasible == feasible and r.skip_set]
        if not group:
            continue
        scatter = ax.scatter(
            [r.accept_length for r in group], [r.metric for r in group], c=[r.cost for r in group],
            cmap="viridis", vmin=vmin, vmax=vmax, marker=marker, s=42 if feasible else 36,
            edgecolors="black" if feasible else "none", linewidths=0.4, alpha=0.9, label=label, zorder=3,
        )
    front = [r for r in records if r.skip_set in pareto]
    if front:
        ax.scatter(
            [r.accept_length for r in front], [r.metric for r in front], s=160, facecolors="none",
            edgecolors="red", linewidths=1.6, label="Pareto set", zorder=4,
        )
    ax.scatter([A0], [M0], marker="s", s=70, color="black", label="dense (∅)", zorder=5)
    best = next((r for r in records if r.skip_set == chosen), None)
    if best is not None and chosen:
        # Put the label on the side of the point facing the plot's centre, so it stays inside.
        xs = [r.accept_length for r in records] + [A0]
        ys = [r.metric for r in records] + [M0]
        right = best.accept_length > (min(xs) + max(xs)) / 2
        top = best.metric > (min(ys) + max(ys)) / 2  # type: ignore[operator]
        ax.annotate(
            f"S* = {format_skip_set(chosen)}\nA={best.accept_length:.3f}, {result.metric_name}={best.metric:.4f}",
            xy=(best.accept_length, best.metric), xytext=(-24 if right else 24, -30 if top else 24),
            textcoords="offset points", fontsize=9, ha="right" if right else "left", va="top" if top else "bottom",
            arrowprops={"arrowstyle": "->", "color": "black"},
            bbox={"boxstyle": "round", "fc": "lightyellow", "alpha": 0.9}, zorder=6,
        )
        ax.scatter([best.accept_length], [best.metric], marker="*", s=260, color="gold", edgecolors="black", zorder=6, label="S*")
    if scatter is not None:
        fig.colorbar(scatter, ax=ax, label="cost (lower is cheaper)", pad=0.02, fraction=0.05)
    ax.set_xlabel("accepted length (tokens per verification step)")
    ax.set_ylabel(result.metric_name)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or f"Evaluated skip sets — {result.study_name}", fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def plot_speedup(report: HeldoutReport, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Held-out speedup (TSS tok/s over native tok/s) per domain with its interval as error bars.

    Bars at or above 1.0 are blue, below red; dense-kept domains are grey at 1.0 with no
    error bar; a dashed line marks 1.0.

    Raises:
        PlotError: The report has no domains.
    """
    from matplotlib.figure import Figure

    if not report.domains:
        raise PlotError("the report has no domains to plot")
    names, est, err_lo, err_hi, colors = [], [], [], [], []
    for c in report.domains:
        names.append(c.domain if c.tss is not None else f"{c.domain}\n(dense kept)")
        iv = c.stats.speedup if c.stats is not None else None
        e = c.speedup
        est.append(0.0 if math.isnan(e) else e)
        lo = 0.0 if iv is None or math.isnan(iv.lower) else max(0.0, e - iv.lower)
        hi = 0.0 if iv is None or math.isnan(iv.upper) else max(0.0, iv.upper - e)
        err_lo.append(lo)
        err_hi.append(hi)
        colors.append(NEUTRAL if c.tss is None else (UP if e >= 1.0 else DOWN))
    fig = Figure(figsize=(max(5.0, 1.2 * len(names) + 2), 4.2), layout="constrained")
    ax = fig.subplots()
    xs = list(range(len(names)))
    ax.bar(xs, est, color=colors, edgecolor="black", linewidth=0.5)
    ax.errorbar(xs, est, yerr=[err_lo, err_hi], fmt="none", ecolor="black", capsize=5, linewidth=1.0)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels(names)
    ax.set_ylabel(f"speedup (TSS / native tok/s), {100 * report.level:g}% interval")
    top = max(e + h for e, h in zip(est, err_hi, strict=True))
    ax.set_ylim(0.0, max(1.2, top * 1.1))
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or f"Held-out speedup per domain — {report.model}", fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
