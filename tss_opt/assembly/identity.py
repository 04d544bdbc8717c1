"""The study's identity from the configuration: its name and metadata (no model is loaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly.settings import (
    check_prompts,
    drafter_config,
    max_new_tokens_for,
    model_settings,
    relaxed_settings,
    require_domain,
    search_settings,
)
from tss_opt.config.enums import Verification

if TYPE_CHECKING:
    from tss_opt.evaluation.domains import Domain


def protocol(cfg: DictConfig, domain: Domain | None = None) -> dict[str, Any]:
    """What one trial measures (:data:`tss_opt.search.identity.PROTOCOL_KEYS`); ``domain``:
    the loaded domain (default: loaded from ``cfg``)."""
    domain = domain or require_domain(cfg)
    mc = model_settings(cfg)
    proto = {
        "prompts": min(check_prompts(cfg.search.prompts) or domain.config.calibration_size, domain.config.calibration_size),
        "max_new_tokens": max_new_tokens_for(cfg, domain),
        "split": cfg.split,
        "scope": str(cfg.scope),
        "cost": str(cfg.cost),
        "temperature": float(cfg.temperature),
        "dtype": mc.dtype,
    }
    # A lossy rule measures other outputs: studies under different rules never mix. Exact
    # verification (the default) adds no key, so earlier study names still match.
    verification = _verification_label(cfg)
    if Verification.lossy_label(verification):
        proto["verification"] = verification
    # Trials of the replay evaluator measure no tokens/s: a study never mixes the two. The
    # default (engine) adds no key, so study names from before this key existed still match.
    # A compiled target measures other seconds (same tokens): its studies stay apart. Off (the
    # default) adds no key, so earlier study names still match.
    if cfg.get("compile"):
        proto["compile"] = True
    target = str(OmegaConf.select(cfg, "evaluator._target_") or "")
    if target and not target.endswith(".build_evaluator"):
        proto["evaluator"] = target.rsplit(".", 1)[-1]
    return proto


def _verification_label(cfg: DictConfig) -> str:
    """``exact``, or the relaxed rule with its settings (``diversed(w=0.6)``, ...)."""
    from tss_opt.decoding.verify.relaxed import settings_label

    return settings_label(str(cfg.get("verification") or "exact"), relaxed_settings(cfg))


def study_identity(cfg: DictConfig, domain: Domain | None = None) -> tuple[str, dict[str, Any]]:
    """The study name and metadata a configuration maps to (no model is loaded).

    The name carries a hash of the search settings (:func:`tss_opt.search.study_name_for`) and
    one of the protocol, so changing either starts a new study instead of mixing measurements.
    ``domain``: the loaded domain (default: loaded from ``cfg``).
    """
    from tss_opt.models import model_id_for
    from tss_opt.search.identity import protocol_hash, study_name_for

    domain = domain or require_domain(cfg)
    mc = model_settings(cfg)
    drafter = drafter_config(cfg)
    settings = search_settings(cfg)
    proto = protocol(cfg, domain)
    name = cfg.get("study_name") or study_name_for(
        domain=domain.name, model=mc.name, drafter=str(drafter.get("name")), split=cfg.split, settings=settings
    ) + f".p{protocol_hash(proto)}"
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
    if "verification" in proto:  # lossy: say so in the dashboard and keep what rebuilds the rule
        metadata["verification"] = proto["verification"]
        metadata["lossy"] = True
        metadata["relaxed"] = {"mode": str(cfg.verification), **relaxed_settings(cfg)}
    return name, metadata
