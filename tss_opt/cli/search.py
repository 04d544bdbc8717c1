"""``python -m tss_opt +domain=NAME [+model=NAME] [search=paper] [storage=URL]``: one search
worker. Any number of workers started with the same command and storage share the study."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from tss_opt.assembly import (
    configured_evaluator,
    require_domain,
    search_settings,
    study_identity,
    validation_evaluator,
)
from tss_opt.config import SearchSettings
from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC
from tss_opt.search import SearchResult, run_search
from tss_opt.search.checks import decide_validation, run_validation
from tss_opt.search.figures import figures_of
from tss_opt.search.identity import check_stored_study

if TYPE_CHECKING:
    from tss_opt.evaluation.domains import Domain

log = logging.getLogger("tss_opt.cli")


def effective_note(cfg: DictConfig, proto: dict[str, Any], settings: SearchSettings) -> str:
    """The preset's warning with the numbers this run uses (overrides applied)."""
    shape = "exhaustive" if settings.mode_spec.every_subset else f"beam width {settings.beam_width}"
    trials = f", <= {settings.max_trials} trials" if settings.max_trials else ""
    return (
        f"{cfg.search.preset} preset: {proto['prompts']} calibration prompts x {proto['max_new_tokens']} tokens, "
        f"{shape}, depth <= {settings.max_depth}{trials} (search=paper for the paper's protocol)"
    )


def search(cfg: DictConfig) -> SearchResult:
    """Join (or start, or resume) the search this configuration names; write the mapping.

    The storage is opened once, with the search's heartbeats, and that one storage serves
    the stored-study check, the search, the validation step and the mapping's export."""
    from tss_opt.mapping import export_mapping
    from tss_opt.storage import open_storage, storage_url

    domain = require_domain(cfg)  # loaded once for the identity, the evaluator and validation
    name, metadata = study_identity(cfg, domain)
    settings = search_settings(cfg)
    if cfg.search.get("note"):
        log.warning("%s", effective_note(cfg, metadata["protocol"], settings))
    storage = open_storage(
        cfg.storage, heartbeat_interval=settings.heartbeat_interval, grace_period=settings.grace_period
    )
    check_stored_study(storage, name, settings, metadata)  # fail before loading the model
    log.info("study %s (storage %s)", name, storage_url(cfg.storage))

    evaluator = configured_evaluator(cfg, domain=domain)
    metadata["model"] = getattr(evaluator, "model_id", metadata["model"])

    t0 = time.perf_counter()
    result = run_search(evaluator, settings, storage=storage, study_name=name, metadata=metadata)
    print(format_result(result, time.perf_counter() - t0))
    validate(cfg, result, evaluator, storage, domain)
    if cfg.write_mapping:
        entry = export_mapping(storage, name, cfg.mapping_path)
        print(f"mapping: {cfg.mapping_path} [{metadata['domain']}] -> skip {sorted(entry.skip_set)}")
    return result


def validate(cfg: DictConfig, result: SearchResult, evaluator: Any, storage: Any, domain: Domain | None = None) -> None:
    """Check the K cheapest feasible candidates on the validation split before the mapping is
    written (:mod:`tss_opt.search.checks`), in order: decide, then (only when
    needed) build the validation evaluator here and run the check."""
    candidates = int(cfg.search.get("validation_candidates") or 0)
    decision = decide_validation(result, storage, candidates)
    if decision.needed:
        domain = domain or require_domain(cfg)
        release = getattr(evaluator, "release_prefills", None)
        if callable(release):  # the calibration prompts' prefills go before validation keeps its own
            release()
        ev = validation_evaluator(cfg, evaluator, domain)
        line = run_validation(result, storage, candidates, ev, "" if ev is not None else _unavailable(domain))
    else:
        line = decision.line
    if line is not None:
        print(line)


def _unavailable(domain: Domain) -> str:
    """Why the validation split has no evaluator."""
    if not domain.split("validation"):
        return "the domain has no validation prompts (validation_size: 0)"
    return "the evaluator cannot run the validation split (its factory takes no `split`)"


def format_result(result: SearchResult, wall_s: float) -> str:
    """Levels, S* against the dense baseline, the Pareto set: what a person reads at the end,
    each figure labelled with what measured it (:func:`tss_opt.search.figures.figures_of`)."""
    lines = [f"study {result.study_name}: {result.stop_reason or 'unfinished'}"]
    lines.append("| level | evaluated / planned | feasible |")
    lines.append("|---|---|---|")
    lines += [f"| {lv.level} | {lv.evaluated} / {lv.total} | {lv.feasible} |" for lv in result.levels]
    lines.append(f"candidate pool: {list(result.pool)}")
    b = result.baseline
    fig = figures_of(b)
    m = result.metric_name
    # A speed column only where decoding was timed (tss_opt.search.figures).
    speed = [fig.speed_header] if fig.speed_key else []
    lines.append("")
    lines.append("| " + " | ".join(["configuration", "skip set", "accepted length", m, fig.cost_header, *speed]) + " |")
    lines.append("|" + "---|" * (5 + len(speed)))

    def row(label: str, skip: frozenset[int], values: Any) -> str:
        cells = [
            label, str(sorted(skip)),
            f"{values[ACCEPT_LENGTH]:.3f}", f"{values[METRIC]:.4f}", f"{values[COST]:.4f}",
        ]
        return "| " + " | ".join(cells + ([fig.speed_cell(values)] if speed else [])) + " |"

    lines.append(row("dense", frozenset(), b))
    lines.append(row(f"S* ({result.selection})", result.best, result.best_record.values))
    lines += [row("Pareto", p, result.record(p).values) for p in result.pareto if p != result.best]
    lines.append(fig.caption)
    if result.given_up:
        lines.append(
            "\nGIVEN UP (their workers crashed repeatedly; treated as infeasible, so S* and the "
            "Pareto set may change once they are measured): "
            + ", ".join(str(sorted(c)) for c in result.given_up)
            + ". Fix the crash and run a new study (study_name=NEW) to measure them."
        )
    lines.append(f"\n{len(result.trials)} configurations; this worker's wall time {wall_s / 60:.1f} min")
    return "\n".join(lines)
