"""Rendering the held-out report: a Markdown table in the layout of the paper's Table 1 with
interval columns, the validation prediction beside the held-out result, a verdict per domain,
and a JSON document with everything behind it (per-prompt records included)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC

if TYPE_CHECKING:
    from tss_opt.evaluation.evaluator import EvalResult
    from tss_opt.report.intervals import Interval
    from tss_opt.report.results import DomainComparison, HeldoutReport

__all__ = [
    "format_interval",
    "format_skip_set",
    "markdown_report",
    "markdown_table",
    "report_to_dict",
    "table_rows",
    "validation_table",
]

# The paper's Table 1 columns, then the paired intervals (filled on TSS rows).
COLUMNS = ("Domain", "Method", "Skip set", "Sparsity", "Accepted length", "Metric", "tok/s", "Speedup")
INTERVAL_COLUMNS = ("ΔA per prompt [CI]", "A ratio [CI]", "ΔMetric per prompt [CI]", "Speedup [CI]")
DENSE_KEPT = "Native (dense kept)"


def format_skip_set(skip: Iterable[int]) -> str:
    """``{3, 25, 30}``; the empty set (dense) as an em dash, as in the paper's Native rows."""
    layers = sorted(skip)
    return "{" + ", ".join(map(str, layers)) + "}" if layers else "—"


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_interval(iv: Interval | None, spec: str, *, signed: bool = False, suffix: str = "") -> str:
    """``+0.312 [+0.101, +0.523]``; ``n/a`` ends with fewer than 2 prompts; ``—`` for none."""
    if iv is None:
        return "—"
    sp = ("+" if signed else "") + spec
    return f"{_fmt(iv.estimate, sp)}{suffix} [{_fmt(iv.lower, sp)}, {_fmt(iv.upper, sp)}]"


def table_rows(comp: DomainComparison) -> list[dict[str, Any]]:
    """The rows of one domain, as plain values: Native and TSS, or one ``Native (dense kept)``
    row (with ``dense_kept_reason``) when the mapping keeps dense. TSS rows carry the paired
    intervals (``accept_diff``, ``accept_ratio``, ``metric_diff``, ``speedup_interval``)."""
    methods: list[tuple[str, EvalResult]] = (
        [(DENSE_KEPT, comp.native)] if comp.tss is None else [("Native", comp.native), ("TSS", comp.tss)]
    )
    rows = []
    for method, res in methods:
        row: dict[str, Any] = {
            "domain": comp.domain,
            "method": method,
            "skip_set": sorted(res.skip),
            "sparsity": len(res.skip) / comp.num_layers,
            ACCEPT_LENGTH: res.accept_length,
            "metric": res.metric,
            "metric_name": comp.metric_name,
            "tokens_per_s": res.tokens_per_s,
            "speedup": comp.speedup if method == "TSS" else 1.0,
            "verification": comp.verification if method == "TSS" else "exact",
            "lossy": comp.lossy and method == "TSS",
        }
        if row["lossy"]:
            row["metric_change"] = comp.metric_change
        if method == DENSE_KEPT:
            row["dense_kept_reason"] = comp.dense_kept_reason
        if method == "TSS" and comp.stats is not None:
            row["accept_diff"] = comp.stats.accept_diff.to_dict()
            row["accept_ratio"] = comp.stats.accept_ratio.to_dict()
            row["metric_diff"] = comp.stats.metric_diff.to_dict()
            row["speedup_interval"] = comp.stats.speedup.to_dict()
        rows.append(row)
    return rows


def markdown_table(report: HeldoutReport) -> str:
    """Rows = domains (Native then TSS; one row when dense is kept), columns as in the
    paper's Table 1 plus the paired intervals of the TSS row."""
    lines = [
        "| " + " | ".join(COLUMNS + INTERVAL_COLUMNS) + " |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for comp in report.domains:
        st = comp.stats
        for r in table_rows(comp):
            k = len(r["skip_set"])
            lossy = r.get("lossy", False)
            speedup = f"{_fmt(r['speedup'], '.2f')}×"
            if lossy:  # a lossy rule's metric change always stands beside its speedup
                speedup += f" (LOSSY, Δ{r['metric_name']} {_fmt(r['metric_change'], '+.4f')})"
            cells = [
                r["domain"],
                f"{r['method']} LOSSY {r['verification']}" if lossy else r["method"],
                format_skip_set(r["skip_set"]),
                f"{k}/{comp.num_layers} ({100 * r['sparsity']:.1f}%)",
                _fmt(r[ACCEPT_LENGTH], ".3f"),
                f"{_fmt(r['metric'], '.4f')} ({r['metric_name']})",
                _fmt(r["tokens_per_s"], ".1f"),
                speedup,
            ]
            if r["method"] == "TSS" and st is not None:
                cells += [
                    format_interval(st.accept_diff, ".3f", signed=True),
                    format_interval(st.accept_ratio, ".3f", suffix="×"),
                    format_interval(st.metric_diff, ".4f", signed=True),
                    format_interval(st.speedup, ".2f", suffix="×"),
                ]
            else:
                cells += ["—"] * len(INTERVAL_COLUMNS)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bound(b: Any, spec: str) -> str:
    """A validation bound ``{mean_diff, lower, upper, ...}`` as ``+0.30 (bound +0.12)``."""
    if not isinstance(b, dict):
        return "n/a"
    return f"{_fmt(b.get('mean_diff', float('nan')), '+' + spec)} (lower bound {_fmt(b.get('lower', float('nan')), '+' + spec)})"


def _yes(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def validation_table(report: HeldoutReport) -> str:
    """Per domain: what validation predicted for S* beside what the held-out prompts gave,
    and the verdict. ``n/a`` where the mapping entry has no validation figures."""
    pct = f"{100 * report.level:g}%"
    lines = [
        f"| Domain | Skip set | validation ΔA (A ratio) | held-out ΔA [{pct}] (A ratio) | A ratio within 10% | "
        f"validation ΔMetric | held-out ΔMetric [{pct}] | metric within tolerance | speedup [{pct}] | speedup ≥ 1.0× | verdict |",
        "|---|---|---:|---:|:-:|---:|---:|:-:|---:|:-:|---|",
    ]
    for comp in report.domains:
        v = comp.verdict
        if comp.tss is None:
            reason = comp.dense_kept_reason or "empty skip set"
            lines.append(
                f"| {comp.domain} | — | n/a | n/a | n/a | n/a | n/a | n/a | 1.00× (dense) | n/a | dense kept: {reason} |"
            )
            continue
        st, pred = comp.stats, comp.prediction
        if pred is not None:
            val_a = f"{_bound(pred.accept_bound, '.3f') if pred.accept_bound else _fmt(pred.accept_change, '+.3f')} ({_fmt(pred.accept_ratio, '.3f')}×)"
            val_m = _bound(pred.metric_bound, ".4f") if pred.metric_bound else _fmt(pred.metric_change, "+.4f")
        else:
            val_a = val_m = "n/a"
        held_a = (
            f"{format_interval(st.accept_diff, '.3f', signed=True)} ({_fmt(st.accept_ratio.estimate, '.3f')}×)" if st else "n/a"
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{comp.domain} (LOSSY {comp.verification})" if comp.lossy else comp.domain,
                    format_skip_set(comp.tss.skip),
                    val_a,
                    held_a,
                    _yes(v.accept_within_prediction if v else None),
                    val_m,
                    format_interval(st.metric_diff, ".4f", signed=True) if st else "n/a",
                    _yes(v.metric_within_tolerance if v else None),
                    format_interval(st.speedup, ".2f", suffix="×") if st else "n/a",
                    _yes(v.speedup_at_least_1 if v else None),
                    ("goal met" if v.goal_met else "**goal missed**") if v else "n/a",
                ]
            )
            + " |"
        )
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
        # A tuned lossy entry: its calibration figures under the rule (relaxed.calibration).
        cal = (e.get("relaxed") or {}).get("calibration") or {}
        if comp.lossy and cal:
            e = {**e, ACCEPT_LENGTH: cal.get(ACCEPT_LENGTH, e.get(ACCEPT_LENGTH)), METRIC: cal.get(METRIC, e.get(METRIC))}
        tss = comp.tss or comp.native  # dense kept: S* is dense, held-out A(S*) = A0
        lines.append(
            f"| {comp.domain}{' (LOSSY)' if comp.lossy else ''} | {format_skip_set(tss.skip)} | "
            f"{_fmt(base.get(ACCEPT_LENGTH, float('nan')), '.3f')} -> {_fmt(e.get(ACCEPT_LENGTH, float('nan')), '.3f')} | "
            f"{comp.native.accept_length:.3f} -> {tss.accept_length:.3f} | "
            f"{_fmt(base.get('metric', float('nan')), '.4f')} -> {_fmt(e.get('metric', float('nan')), '.4f')} | "
            f"{comp.native.metric:.4f} -> {tss.metric:.4f} |"
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
        f"- intervals: two-sided {100 * report.level:g}%, paired over prompts. Δ columns: mean per-prompt "
        "difference TSS - native with a Student-t interval; ratios (A ratio, speedup): ratio of per-prompt means "
        f"with a paired percentile bootstrap ({report.resamples} resamples, seed {report.seed}). "
        "ΔMetric is on per-prompt scores (a corpus metric such as BLEU is not their mean).",
        "- domains whose mapping keeps dense ran native only (one row).",
        *(
            ["- **LOSSY** rows ran the mapping entry's relaxed verification rule (native is dense exact "
             "verification): their output is not the target's own; their metric change is shown beside the speedup."]
            if any(c.lossy for c in report.domains) else []
        ),
        f"- created {report.created}, wall time {_duration(report.wall_s)}",
        "",
        markdown_table(report),
    ]
    if report.domains:
        speedups = [c.speedup for c in report.domains if not math.isnan(c.speedup)]
        gains = [
            (c.tss or c.native).accept_length / c.native.accept_length - 1
            for c in report.domains
            if c.native.accept_length > 0
        ]
        if speedups:
            parts += [
                "",
                f"Mean over {len(speedups)} domain(s): speedup {sum(speedups) / len(speedups):.2f}×, "
                f"accepted length {100 * sum(gains) / max(1, len(gains)):+.1f}%.",
            ]
        t = report.tolerance
        tol = (
            f"max(eps_metric={t.eps:g} × native's mean, eps_metric_abs={t.floor:g})"
            if t.relative
            else f"eps_metric={t.eps:g} (absolute)"
        )
        parts += [
            "",
            "## Validation prediction against held-out, and the verdict",
            "",
            validation_table(report),
            "",
            "- validation columns: the mapping entry's validation figures of S* (mean paired difference to dense "
            "and its one-sided lower bound at the validation confidence; n/a when the entry was not validated).",
            "- A ratio within 10%: |held-out A ratio / validation A ratio - 1| <= 0.10.",
            f"- metric within tolerance: the lower end of the {100 * report.level:g}% interval of ΔMetric "
            f"(oriented by the metric's direction) >= -tolerance, {tol}: the metric is not significantly below native.",
            "- speedup ≥ 1.0×: the point estimate; goal met = metric within tolerance, speedup ≥ 1.0× and "
            "(where validated) A ratio within 10%. Dense kept is a correct answer, not a failure.",
        ]
        kept = [c for c in report.domains if c.tss is None]
        if kept:
            parts += [""] + [f"- **{c.domain}: dense kept** — {c.dense_kept_reason}" for c in kept]
        parts += ["", "## Calibration (search) against held-out", "", _calibration_table(report)]
        figs = [(c.domain, c.plots, c.plot_error) for c in report.domains]
        parts += ["", "## Plots", ""]
        if report.plots.get("speedup"):
            parts += [f"- all domains: [speedup]({_link(report.plots['speedup'], link_base)})"]
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
            ACCEPT_LENGTH: p.accept_length,
            "tokens_per_s": p.tokens_per_s,
            "new_tokens": p.new_tokens,
            "steps": p.steps,
            "repetition": p.repetition,
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
        "intervals": {
            "level": report.level,
            "differences": "paired t: mean(TSS_i - native_i) -/+ t_{(1+level)/2, n-1} * sd / sqrt(n)",
            "ratios": "paired percentile bootstrap of mean(TSS_i) / mean(native_i) over prompts",
            "resamples": report.resamples,
            "seed": report.seed,
        },
        "verdict_rule": {
            **report.tolerance.to_dict(),
            "tolerance": "max(eps_metric * |native mean|, eps_metric_abs) if relative and eps_metric > 0, "
            "else eps_metric * |native mean| (relative) or eps_metric (absolute)",
            "metric": "lower end of the oriented metric-difference interval >= -tolerance",
            "speedup": "point speedup >= 1.0",
            ACCEPT_LENGTH: "|held-out A ratio / validation A ratio - 1| <= 0.10",
        },
        "plots": dict(report.plots),
        "rows": [r for c in report.domains for r in table_rows(c)],
        "domains": {
            c.domain: {
                "metric_name": c.metric_name,
                "metric_higher_is_better": c.metric_higher_is_better,
                "prompts": c.num_prompts,
                "max_new_tokens": c.max_new_tokens,
                "speedup": c.speedup,
                "dense_kept": c.dense_kept,
                "dense_kept_reason": c.dense_kept_reason,
                "verification": c.verification,
                "lossy": c.lossy,
                "metric_change": c.metric_change,
                "stats": c.stats.to_dict() if c.stats is not None else None,
                "validation_prediction": c.prediction.to_dict() if c.prediction is not None else None,
                "verdict": c.verdict.to_dict() if c.verdict is not None else None,
                "native": _result_dict(c.native),
                "tss": _result_dict(c.tss) if c.tss is not None else None,
                "mapping_entry": c.entry,
                "plots": dict(c.plots),
                "plot_error": c.plot_error,
            }
            for c in report.domains
        },
    }
