"""``python -m tss_opt +domain=NAME [+model=NAME] [search=paper] [storage=URL]``: one search
worker. Any number of workers started with the same command and storage share the study."""

from __future__ import annotations

import logging
import time

import hydra.utils
from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly import search_settings, study_identity
from tss_opt.search import SearchResult, run_search
from tss_opt.search.identity import check_stored_study

log = logging.getLogger("tss_opt.cli")

def search(cfg: DictConfig) -> SearchResult:
    """Join (or start, or resume) the search this configuration names; write the mapping."""
    from tss_opt.mapping import export_mapping
    from tss_opt.storage import open_storage

    name, metadata = study_identity(cfg)
    settings = search_settings(cfg)
    if cfg.search.get("note"):
        log.warning("%s", cfg.search.note)
    storage = open_storage(cfg.storage, heartbeat_interval=None, grace_period=None)
    check_stored_study(storage, name, settings, metadata)  # fail before loading the model
    log.info("study %s (storage %s)", name, cfg.storage or "sqlite:///storage/tss.db")

    ev_cfg = OmegaConf.to_container(cfg.evaluator, resolve=True)
    target = ev_cfg.pop("_target_")
    evaluator = hydra.utils.get_method(target)(cfg=cfg, **ev_cfg)
    metadata["model"] = getattr(evaluator, "model_id", metadata["model"])

    t0 = time.perf_counter()
    result = run_search(evaluator, settings, storage=cfg.storage, study_name=name, metadata=metadata)
    print(format_result(result, time.perf_counter() - t0))
    if cfg.write_mapping:
        entry = export_mapping(cfg.storage, name, cfg.mapping_path)
        print(f"mapping: {cfg.mapping_path} [{metadata['domain']}] -> skip {sorted(entry.skip_set)}")
    return result


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
    lines.append(f"\n{len(result.trials)} configurations; this worker's wall time {wall_s / 60:.1f} min")
    return "\n".join(lines)
