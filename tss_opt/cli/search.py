"""``python -m tss_opt +domain=NAME [+model=NAME] [search=paper] [storage=URL]``: one search
worker. Any number of workers started with the same command and storage share the study."""

from __future__ import annotations

import logging
import time
from typing import Any

import hydra.utils
from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly import search_settings, study_identity
from tss_opt.config import SearchSettings
from tss_opt.search import SearchResult, run_search
from tss_opt.search.identity import check_stored_study

log = logging.getLogger("tss_opt.cli")


def effective_note(cfg: DictConfig, proto: dict[str, Any], settings: SearchSettings) -> str:
    """The preset's warning with the numbers this run uses (overrides applied)."""
    shape = f"beam width {settings.beam_width}" if settings.mode == "beam" else "exhaustive"
    trials = f", <= {settings.max_trials} trials" if settings.max_trials else ""
    return (
        f"{cfg.search.preset} preset: {proto['prompts']} calibration prompts x {proto['max_new_tokens']} tokens, "
        f"{shape}, depth <= {settings.max_depth}{trials} (search=paper for the paper's protocol)"
    )


def search(cfg: DictConfig) -> SearchResult:
    """Join (or start, or resume) the search this configuration names; write the mapping."""
    from tss_opt.mapping import export_mapping
    from tss_opt.storage import open_storage, storage_url

    name, metadata = study_identity(cfg)
    settings = search_settings(cfg)
    if cfg.search.get("note"):
        log.warning("%s", effective_note(cfg, metadata["protocol"], settings))
    storage = open_storage(cfg.storage, heartbeat_interval=None, grace_period=None)
    check_stored_study(storage, name, settings, metadata)  # fail before loading the model
    log.info("study %s (storage %s)", name, storage_url(cfg.storage))

    ev_cfg = OmegaConf.to_container(cfg.evaluator, resolve=True)
    target = ev_cfg.pop("_target_")
    evaluator = hydra.utils.get_method(target)(cfg=cfg, **ev_cfg)
    metadata["model"] = getattr(evaluator, "model_id", metadata["model"])

    t0 = time.perf_counter()
    result = run_search(evaluator, settings, storage=cfg.storage, study_name=name, metadata=metadata)
    print(format_result(result, time.perf_counter() - t0))
    validate(cfg, result, evaluator, storage)
    if cfg.write_mapping:
        entry = export_mapping(cfg.storage, name, cfg.mapping_path)
        print(f"mapping: {cfg.mapping_path} [{metadata['domain']}] -> skip {sorted(entry.skip_set)}")
    return result


def validate(cfg: DictConfig, result: SearchResult, evaluator: Any, storage: Any) -> None:
    """Check the K cheapest feasible candidates on the validation split before the mapping is
    written (issue 10): the mapping gets the cheapest that passes, or dense with the reason.

    Runs once per study: a worker that finds the outcome stored already reuses it.
    """
    import optuna

    from tss_opt.assembly import validation_evaluator
    from tss_opt.search import validate_candidates
    from tss_opt.search.validation import VALIDATION_ATTR, store_validation

    k = int(cfg.search.get("validation_candidates") or 0)
    if k < 1:
        log.warning("validation skipped (search.validation_candidates=%s): the mapping takes S* unchecked", k)
        return
    stored = optuna.load_study(study_name=result.study_name, storage=storage).user_attrs.get(VALIDATION_ATTR)
    if stored is not None:
        print(f"validation (stored): {_validation_line(stored)}")
        return
    if not result.best and not [c for c in result.pareto if c]:
        log.info("validation: nothing to validate (S* is dense)")
        return
    release = getattr(evaluator, "release_prefills", None)
    if callable(release):  # the calibration prompts' prefills go before validation keeps its own
        release()
    ev = validation_evaluator(cfg, evaluator)
    if ev is None:
        from tss_opt.assembly import require_domain

        why = (
            "the domain has no validation prompts (validation_size: 0)"
            if not require_domain(cfg).split("validation")
            else "the evaluator cannot run the validation split (its factory takes no `split`)"
        )
        log.warning("validation skipped: %s; the mapping takes S* unchecked", why)
        return
    t0 = time.perf_counter()
    log.info("validation: the %d cheapest feasible candidates and dense on %d validation prompts", k, ev.num_prompts if hasattr(ev, "num_prompts") else -1)
    outcome = validate_candidates(result, ev, k)
    store_validation(storage, result.study_name, outcome)
    print(f"validation ({(time.perf_counter() - t0) / 60:.1f} min): {_validation_line(outcome.to_dict())}")


def _validation_line(v: dict[str, Any]) -> str:
    chosen = v.get("chosen") or []
    checked = ", ".join(
        f"{c.get('skip_set')}: {'pass' if c.get('passed') else 'fail'}" for c in v.get("candidates", [])
    )
    head = f"dense kept ({v.get('reason')})" if not chosen else f"chosen {chosen}"
    return f"{head}; checked {checked or 'none'}"


def format_result(result: SearchResult, wall_s: float) -> str:
    """Levels, S* against the dense baseline, the Pareto set: what a person reads at the end."""
    lines = [f"study {result.study_name}: {result.stop_reason or 'unfinished'}"]
    lines.append("| level | evaluated / planned | feasible |")
    lines.append("|---|---|---|")
    lines += [f"| {lv.level} | {lv.evaluated} / {lv.total} | {lv.feasible} |" for lv in result.levels]
    lines.append(f"candidate pool: {list(result.pool)}")
    b = result.baseline
    best = result.best_record
    m = result.metric_name
    lines.append("")
    lines.append(f"| configuration | skip set | accepted length | {m} | cost | tok/s |")
    lines.append("|---|---|---|---|---|---|")
    lines.append(
        f"| dense | [] | {b['accept_length']:.3f} | {b['metric']:.4f} | {b['cost']:.4f} | {b.get('tokens_per_s', float('nan')):.2f} |"
    )
    lines.append(
        f"| S* ({result.selection}) | {sorted(best.skip_set)} | {best.accept_length:.3f} | {best.metric:.4f} | "
        f"{best.cost:.4f} | {best.values.get('tokens_per_s', float('nan')):.2f} |"
    )
    for p in result.pareto:
        if p != result.best:
            r = result.record(p)
            lines.append(
                f"| Pareto | {sorted(p)} | {r.accept_length:.3f} | {r.metric:.4f} | {r.cost:.4f} | "
                f"{r.values.get('tokens_per_s', float('nan')):.2f} |"
            )
    if result.given_up:
        lines.append(
            "\nGIVEN UP (their workers crashed repeatedly; treated as infeasible, so S* and the "
            "Pareto set may change once they are measured): "
            + ", ".join(str(sorted(c)) for c in result.given_up)
            + ". Fix the crash and run a new study (study_name=NEW) to measure them."
        )
    lines.append(f"\n{len(result.trials)} configurations; this worker's wall time {wall_s / 60:.1f} min")
    return "\n".join(lines)
