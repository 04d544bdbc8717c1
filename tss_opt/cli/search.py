"""``python -m tss_opt +domain=NAME [+model=NAME] [search=paper] [storage=URL]``: one search
worker. Any number of workers started with the same command and storage share the study."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import fields
from typing import Any

import hydra.utils
import optuna
from omegaconf import DictConfig, OmegaConf

from tss_opt.cli.common import (
    UsageError,
    check_prompts,
    drafter_config,
    max_new_tokens_for,
    model_config,
    require_domain,
)
from tss_opt.evaluation.cost import COSTS
from tss_opt.evaluation.decoding.engine import SCOPES
from tss_opt.models import as_model_config, model_id_for
from tss_opt.search import SearchResult, SearchSettings, run_search, study_name_for

log = logging.getLogger("tss_opt.cli")

# Settings that change what a trial measures; they name the study and are checked on resume.
PROTOCOL_KEYS = ("prompts", "max_new_tokens", "split", "scope", "cost", "temperature", "dtype")


def search_settings(cfg: DictConfig) -> SearchSettings:
    names = {f.name for f in fields(SearchSettings)}
    values = {k: v for k, v in OmegaConf.to_container(cfg.search, resolve=True).items() if k in names}
    return SearchSettings(**values)


def protocol(cfg: DictConfig) -> dict[str, Any]:
    domain = require_domain(cfg)
    mc = as_model_config(model_config(cfg))
    return {
        "prompts": min(check_prompts(cfg.search.prompts) or domain.config.calibration_size, domain.config.calibration_size),
        "max_new_tokens": max_new_tokens_for(cfg, domain),
        "split": cfg.split,
        "scope": cfg.scope,
        "cost": cfg.cost,
        "temperature": float(cfg.temperature),
        "dtype": mc.dtype,
    }


def study_identity(cfg: DictConfig) -> tuple[str, dict[str, Any]]:
    """The study name and metadata a configuration maps to (no model is loaded)."""
    if cfg.scope not in SCOPES:
        raise UsageError(f"scope={cfg.scope!r}; expected one of {', '.join(SCOPES)}")
    if cfg.cost not in COSTS:
        raise UsageError(f"cost={cfg.cost!r}; expected one of {', '.join(COSTS)}")
    domain = require_domain(cfg)
    mc = as_model_config(model_config(cfg))
    drafter = drafter_config(cfg)
    settings = search_settings(cfg)
    proto = protocol(cfg)
    # The name carries a hash of the search settings (study_name_for) and one of the
    # protocol, so changing either starts a new study instead of mixing measurements.
    proto_hash = hashlib.sha1(json.dumps(proto, sort_keys=True).encode()).hexdigest()[:5]
    name = cfg.get("study_name") or study_name_for(
        domain=domain.name, model=mc.name, drafter=str(drafter.get("name")), split=cfg.split, settings=settings
    ) + f".p{proto_hash}"
    metadata = {
        "domain": domain.name,
        "model": model_id_for(mc),
        "model_name": mc.name,
        "num_layers": mc.num_layers,
        "drafter": drafter.get("name"),
        "drafter_config": drafter,
        "metric": domain.config.metric,
        "preset": cfg.search.preset,
        "split": cfg.split,
        "protocol": proto,
    }
    return name, metadata


def _check_protocol(storage: Any, name: str, metadata: dict[str, Any]) -> None:
    """A stored study measured under another protocol is refused (optuna would mix them)."""
    try:
        stored = optuna.load_study(study_name=name, storage=storage).user_attrs.get("metadata") or {}
    except KeyError:
        return  # a new study
    old = stored.get("protocol")
    if old and old != metadata["protocol"]:
        diff = {k: (old.get(k), metadata["protocol"].get(k)) for k in PROTOCOL_KEYS if old.get(k) != metadata["protocol"].get(k)}
        raise UsageError(
            f"study {name!r} was run with another protocol: "
            + ", ".join(f"{k} stored {a!r} vs now {b!r}" for k, (a, b) in diff.items())
            + ". Re-run with the stored values, or start a new study with study_name=<new name>."
        )


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
    _check_protocol(storage, name, metadata)
    log.info("study %s (storage %s)", name, storage_url(cfg.storage))

    ev_cfg = OmegaConf.to_container(cfg.evaluator, resolve=True)
    target = ev_cfg.pop("_target_")
    evaluator = hydra.utils.get_method(target)(cfg=cfg, **ev_cfg)
    metadata["model"] = getattr(evaluator, "model_id", metadata["model"])

    t0 = time.perf_counter()
    result = run_search(
        evaluator, storage=cfg.storage, study_name=name, metadata=metadata, **settings.to_dict()
    )
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
    if result.given_up:
        lines.append(
            "\nGIVEN UP (their workers crashed repeatedly; treated as infeasible, so S* and the "
            "Pareto set may change once they are measured): "
            + ", ".join(str(sorted(c)) for c in result.given_up)
            + ". Fix the crash and run a new study (study_name=NEW) to measure them."
        )
    lines.append(f"\n{len(result.trials)} configurations; this worker's wall time {wall_s / 60:.1f} min")
    return "\n".join(lines)
