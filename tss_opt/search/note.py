"""The search summary as an optuna-dashboard study note.

At the end of :func:`~tss_opt.search.run_search` the study gets a Markdown note (levels, the
dense baseline, S*, the Pareto set, why the search stopped), shown on the study's page of
``optuna-dashboard <storage URL>`` above the plots, so whoever opens the dashboard reads the
outcome without reading logs. Every worker that finishes writes the same note; the latest is
shown (the dashboard keeps versions).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import optuna

from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC
from tss_opt.search.algorithm import canonical
from tss_opt.search.figures import Figures, figures_of
from tss_opt.search.result import SearchResult, TrialRecord

__all__ = ["format_note", "save_search_note"]

logger = logging.getLogger(__name__)


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{float(value):.{digits}f}"


def _row(label: str, skip: frozenset[int], values: Mapping[str, Any] | TrialRecord, fig: Figures) -> str:
    if isinstance(values, TrialRecord):
        a, m, c, rest = values.accept_length, values.metric, values.cost, values.values
    else:
        a, m, c, rest = values.get(ACCEPT_LENGTH), values.get(METRIC), values.get(COST), values
    speed = f" {fig.speed_cell(rest)} |" if fig.speed_key else ""
    return f"| {label} | {list(canonical(skip))} | {_num(a)} | {_num(m, 4)} | {_num(c, 4)} |{speed}"


def format_note(result: SearchResult) -> str:
    """The Markdown summary of a search: stop reason, levels, dense vs S* vs the Pareto set."""
    m = result.metric_name
    fig = figures_of(result.baseline)
    speed_head, speed_rule = (f" {fig.speed_header} |", "---:|") if fig.speed_key else ("", "")
    lines = [
        f"## TSS search: {result.study_name}",
        "",
        f"**Stopped:** {result.stop_reason or 'unfinished'} · **selection:** `{result.selection}` · "
        f"**S\\*:** `{list(canonical(result.best))}` ({len(result.best)}/{result.num_layers} layers skipped) · "
        f"{len(result.trials)} configurations evaluated",
        "",
        f"Candidate pool (level-1 survivors): `{list(result.pool)}`",
        "",
        "### Levels",
        "",
        "| level | evaluated / planned | feasible |",
        "|---:|---:|---:|",
        *(f"| {lv.level} | {lv.evaluated} / {lv.total} | {lv.feasible} |" for lv in result.levels),
        "",
        "### Dense, S* and the Pareto set",
        "",
        f"| configuration | skip set | accepted length | {m} | {fig.cost_header} |{speed_head}",
        f"|---|---|---:|---:|---:|{speed_rule}",
        _row("dense", frozenset(), result.baseline, fig),
    ]
    if result.best:
        lines.append(_row(f"**S\\*** ({result.selection})", result.best, result.best_record, fig))
    lines += [_row("Pareto", p, result.record(p), fig) for p in result.pareto if p != result.best]
    lines += [
        "",
        fig.caption,
        "",
        "Objectives: accepted length (max), task metric (direction of the metric), cost (min). "
        "Feasible: no worse than dense on acceptance and metric (the constraints column).",
    ]
    return "\n".join(lines)


def save_search_note(study: optuna.Study, result: SearchResult) -> None:
    """Write :func:`format_note` as the study's dashboard note; a failure is logged, never
    raised (the search result is stored already)."""
    try:
        from optuna_dashboard import save_note

        save_note(study, format_note(result))
    except Exception as e:  # a note is a convenience: never fail a finished search over it
        logger.warning("could not write the dashboard note of study '%s': %s", result.study_name, e)
