"""Rendering the held-out report: a Markdown table in the layout of the paper's Table 1 and a
JSON document with everything behind it (per-prompt records included)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tss_opt.evaluation.evaluator import EvalResult
    from tss_opt.report.results import DomainComparison, HeldoutReport

__all__ = ["format_skip_set", "markdown_report", "markdown_table", "report_to_dict", "table_rows"]

COLUMNS = ("Domain", "Method", "Skip set", "Sparsity", "Accepted length", "Metric", "tok/s", "Speedup")


def format_skip_set(skip: Iterable[int]) -> str:
    """``{3, 25, 30}``; the empty set (dense) as an em dash, as in the paper's Native rows."""
    layers = sorted(skip)
    return "{" + ", ".join(map(str, layers)) + "}" if layers else "—"


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table_rows(comp: DomainComparison) -> list[dict[str, Any]]:
    """The two rows (Native, TSS) of one domain, as plain values."""
    rows = []
    for method, res in (("Native", comp.native), ("TSS", comp.tss)):
        speed = 1.0 if method == "Native" else comp.speedup
        rows.append(
            {
                "domain": comp.domain,
                "method": method,
                "skip_set": sorted(res.skip),
                "sparsity": len(res.skip) / comp.num_layers,
                "accept_length": res.accept_length,
                "metric": res.metric,
                "metric_name": comp.metric_name,
                "tokens_per_s": res.tokens_per_s,
                "speedup": speed,
            }
        )
    return rows


def markdown_table(report: HeldoutReport) -> str:
    """Rows = domains (Native then TSS), columns as in the paper's Table 1."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for comp in report.domains:
        for r in table_rows(comp):
            k = len(r["skip_set"])
            cells = [
                r["domain"],
                r["method"],
                format_skip_set(r["skip_set"]),
                f"{k}/{comp.num_layers} ({100 * r['sparsity']:.1f}%)",
                _fmt(r["accept_length"], ".3f"),
                f"{_fmt(r['metric'], '.4f')} ({r['metric_name']})",
                _fmt(r["tokens_per_s"], ".1f"),
                f"{_fmt(r['speedup'], '.2f')}×",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _calibration_table(report: HeldoutReport) -> str:
    """What the search measured on the calibration prompts, next to the held-out numbers."""
    lines = [
        "| Domain | Skip set | A0 -> A(S*) calibration | A0 -> A(S*) held-out | M0 -> M(S*) calibration | M0 -> M(S*) held-out |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for comp in report.domains:
        e = comp.entry
        base = e.get("baseline", {})
        lines.append(
            f"| {comp.domain} | {format_skip_set(comp.tss.skip)} | "
            f"{_fmt(base.get('accept_length', float('nan')), '.3f')} -> {_fmt(e.get('accept_length', float('nan')), '.3f')} | "
            f"{comp.native.accept_length:.3f} -> {comp.tss.accept_length:.3f} | "
            f"{_fmt(base.get('metric', float('nan')), '.4f')} -> {_fmt(e.get('metric', float('nan')), '.4f')} | "
            f"{comp.native.metric:.4f} -> {comp.tss.metric:.4f} |"
        )
    return "\n".join(lines)


def markdown_report(report: HeldoutReport, link_base: str | os.PathLike[str] | None = None) -> str:
    """The whole Markdown document: header, Table 1, averages, calibration check, plots.

    Args:
        report: The report.
        link_base: The folder the document is written to: plot links are made relative to
            it, so the folder can be moved or published as a whole.
    """
    n_prompts = sorted({c.num_prompts for c in report.domains})
    n_tokens = sorted({c.max_new_tokens for c in report.domains})
    parts = [
        "# TSS held-out evaluation",
        "",
        f"- model: `{report.model}` ({report.num_layers} layers); drafter: `{report.drafter or 'default'}`; "
        f"scope: {report.scope}; temperature: {report.temperature:g}",
        f"- held-out prompts per domain: {', '.join(map(str, n_prompts))}; new tokens per prompt: "
        f"{', '.join(map(str, n_tokens))}; mapping: `{report.mapping_path}`",
        "- native and TSS ran in one process, interleaved per prompt, with the same drafter settings; "
        "tok/s is the mean over prompts of tokens / wall time; speedup is the ratio of the means.",
        f"- created {report.created}, wall time {_duration(report.wall_s)}",
        "",
        markdown_table(report),
    ]
    if report.domains:
        speedups = [c.speedup for c in report.domains if not math.isnan(c.speedup)]
        gains = [
            c.tss.accept_length / c.native.accept_length - 1 for c in report.domains if c.native.accept_length > 0
        ]
        if speedups:
            parts += [
                "",
                f"Mean over {len(speedups)} domain(s): speedup {sum(speedups) / len(speedups):.2f}×, "
                f"accepted length {100 * sum(gains) / max(1, len(gains)):+.1f}%.",
            ]
        parts += ["", "## Calibration (search) against held-out", "", _calibration_table(report)]
        figs = [(c.domain, c.plots, c.plot_error) for c in report.domains]
        parts += ["", "## Plots", ""]
        for domain, plots, err in figs:
            if plots:
                links = ", ".join(f"[{k}]({_link(v, link_base)})" for k, v in sorted(plots.items()))
                parts += [f"- {domain}: {links}"]
            else:
                parts += [f"- {domain}: none ({err or 'no study'})"]
    return "\n".join(parts) + "\n"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _link(path: str, base: str | os.PathLike[str] | None) -> str:
    if base is None:
        return path
    return Path(os.path.relpath(path, base)).as_posix()


def _result_dict(res: EvalResult) -> dict[str, Any]:
    d = res.to_dict()
    d["skip_set"] = sorted(res.skip)
    d["prompts"] = [
        {
            "id": p.id,
            "score": p.score,
            "accept_length": p.accept_length,
            "tokens_per_s": p.tokens_per_s,
            "new_tokens": p.new_tokens,
            "steps": p.steps,
            "output": p.output,
        }
        for p in res.prompts
    ]
    return d


def report_to_dict(report: HeldoutReport) -> dict[str, Any]:
    """The JSON document: protocol, Table 1 rows, and per domain both full results."""
    return {
        "model": report.model,
        "num_layers": report.num_layers,
        "drafter": report.drafter,
        "scope": report.scope,
        "temperature": report.temperature,
        "mapping_path": report.mapping_path,
        "created": report.created,
        "wall_s": report.wall_s,
        "rows": [r for c in report.domains for r in table_rows(c)],
        "domains": {
            c.domain: {
                "metric_name": c.metric_name,
                "prompts": c.num_prompts,
                "max_new_tokens": c.max_new_tokens,
                "speedup": c.speedup,
                "native": _result_dict(c.native),
                "tss": _result_dict(c.tss),
                "mapping_entry": c.entry,
                "plots": dict(c.plots),
                "plot_error": c.plot_error,
            }
            for c in report.domains
        },
    }
