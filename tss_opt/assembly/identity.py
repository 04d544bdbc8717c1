"""The study's identity from the configuration: its name and metadata (no model is loaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from tss_opt.assembly.evaluators import evaluator_label
from tss_opt.assembly.settings import (
    base_protocol,
    check_prompts,
    drafter_config,
    max_new_tokens_for,
    model_settings,
    relaxed_settings,
    require_domain,
    search_settings,
)

if TYPE_CHECKING:
    from tss_opt.evaluation.domains import Domain
    from tss_opt.evaluation.protocol import StudyProtocol


def study_protocol(cfg: DictConfig, domain: Domain | None = None) -> StudyProtocol:
    """What one trial measures (:class:`~tss_opt.evaluation.protocol.StudyProtocol`), read
    from the configuration without loading a model; ``domain``: the loaded domain (default:
    loaded from ``cfg``).

    The decoding settings are the evaluators' own (:func:`base_protocol` with
    :func:`max_new_tokens_for`), so a study is named by exactly what its trials decode.
    """
    from tss_opt.evaluation.protocol import StudyProtocol

    domain = domain or require_domain(cfg)
    calibration = domain.config.calibration_size
    max_new_tokens = max_new_tokens_for(cfg, domain)  # a bad length is a usage error, said first
    return StudyProtocol(
        decode=base_protocol(cfg).replace(max_new_tokens=max_new_tokens),
        # The preset's count is an upper bound; the calibration size counts for every split.
        prompts=min(check_prompts(cfg.search.prompts) or calibration, calibration),
        split=str(cfg.split),
        dtype=model_settings(cfg, "search").dtype,  # dtype=auto names the float32 study on CPU
        verification=_verification_label(cfg),
        compile=bool(cfg.get("compile")),
        evaluator=evaluator_label(cfg),
    )


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
    mc = model_settings(cfg, "search")
    drafter = drafter_config(cfg)
    settings = search_settings(cfg)
    proto = study_protocol(cfg, domain).identity()
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
