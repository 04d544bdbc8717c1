"""Serving from the composed configuration: the controller, the server's drafter and the
server's start-up state, built here so that the runtime below takes typed values only
(:class:`~tss_opt.runtime.controller.TSSController`'s arguments, a
:class:`~tss_opt.runtime.server.settings.ServerSettings`), never the raw ``DictConfig``.

Not re-exported by :mod:`tss_opt.assembly`: importing it loads the server (FastAPI, uvicorn).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf, open_dict

from tss_opt.assembly.runtime import Assembly, assemble, serving_protocol
from tss_opt.assembly.settings import check_distribution_drafter, drafter_config, model_settings
from tss_opt.config.serve import serve_settings
from tss_opt.mapping import load_mapping
from tss_opt.runtime.controller import TSSController, check_mapping_model, domain_system_prompts
from tss_opt.runtime.router_setup import load_or_fit_router, router_cache_path

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tss_opt.config.domain import DomainConfig
    from tss_opt.runtime.router import DomainRouter
    from tss_opt.runtime.server.app import ServingState
    from tss_opt.runtime.vllm_plugin.launch import VLLMLaunch

__all__ = ["build_controller", "build_state", "build_vllm_launch", "chosen_domain", "with_serving_drafter"]

log = logging.getLogger(__name__)


def chosen_domain(cfg: DictConfig) -> DomainConfig | None:
    """The composed ``+domain=NAME`` config as a typed value (``None`` when none is chosen)."""
    from tss_opt.evaluation.domains import to_domain_config

    node = cfg.get("domain")
    return None if node is None else to_domain_config(node)


def _router(rt: Assembly, mapping_path: str, extra_domains: Iterable[str] = ()) -> DomainRouter:
    """The loaded model's router, cached next to the mapping file (``router.<model>.json``)."""
    model_id = rt.loaded.model_id
    return load_or_fit_router(
        rt.target, rt.loaded.tokenizer, model_id, router_cache_path(mapping_path, model_id), extra_domains
    )


def build_controller(
    cfg: DictConfig, *, runtime: Assembly | None = None, with_router: bool | None = None
) -> TSSController:
    """Build the controller the configuration describes (model, drafter, ``mapping_path``).

    Args:
        cfg: The composed configuration (``conf/config.yaml``).
        runtime: An already loaded runtime (default: load ``cfg.model``).
        with_router: Build the domain router; ``None``: only when ``cfg.request_domain``
            is unset (a labelled request does not need one). The router is fitted on the
            calibration prompts of the shipped domains once and cached next to the mapping
            file (``router.<model>.json``).

    Raises:
        MappingError: Missing, corrupt or other-model mapping.
    """
    mapping = load_mapping(cfg.mapping_path)  # fail before loading a model for nothing
    rt = runtime or assemble(cfg)
    check_mapping_model(mapping, rt.loaded.model_id, rt.target.num_layers)
    note = mapping.precision_note(rt.loaded.config.dtype)
    if note:
        log.warning("%s", note)
    drafter = rt.drafter_cfg.get("name")
    searched = sorted({e.drafter for e in mapping.entries.values() if e.drafter})
    if drafter and searched and searched != [drafter]:
        log.warning(
            "serving with drafter %r but the mapping's skip sets were searched with %s; they "
            "may not be the best ones for this drafter (drafter=%s selects it)",
            drafter, ", ".join(searched), searched[0],
        )
    if with_router is None:
        with_router = not cfg.get("request_domain")
    system_prompts = domain_system_prompts(mapping.domains, chosen_domain(cfg))
    router = None
    # With no mapped domain every request runs dense: no need to fit a router.
    if with_router and mapping.entries:
        router = _router(rt, cfg.mapping_path, mapping.domains)
    entry_rules = bool(cfg.get("serve_lossy_entries", True))
    for d, e in sorted(mapping.entries.items()):
        if entry_rules and e.lossy:
            check_distribution_drafter(
                f"{e.verification} (mapping entry {d!r}; serve_lossy_entries=false serves it exact)", rt.drafter_cfg
            )
    return TSSController(
        rt.target,
        rt.loaded.tokenizer,
        mapping,
        rt.new_drafter,
        router=router,
        model_id=rt.loaded.model_id,
        # No global scope: each entry carries the one its search measured (docs/mapping.md).
        system_prompts=system_prompts,
        entry_rules=entry_rules,
        protocol=serving_protocol(cfg, rt),
    )


def build_state(cfg: DictConfig) -> ServingState:
    """Check the settings (before loading anything: a refused start costs nothing), then load
    the model, drafter, mapping and router (fitted or loaded now, not on the first request).

    Raises:
        UsageError: Bad settings (a non-loopback host without a key, a port in use...).
        MappingError: Missing, corrupt or other-model mapping.
    """
    from tss_opt.runtime.server.app import ServingState
    from tss_opt.runtime.server.run import check_bind, draft_depth_policy
    from tss_opt.runtime.server.settings import ServerSettings

    settings = ServerSettings.from_serve(serve_settings(cfg))
    check_bind(settings.host, settings.port)
    load_mapping(cfg.mapping_path)  # a missing or corrupt file fails before the model loads
    cfg = with_serving_drafter(cfg)
    rt = assemble(cfg)
    controller = build_controller(cfg, runtime=rt, with_router=True)
    if controller.router is None:
        # An empty mapping needs no router yet, but a search may fill it while the server
        # runs (it is reloaded): fit the router now rather than on a request or a restart.
        controller.router = _router(rt, cfg.mapping_path)
    name = settings.served_model_name or str(cfg.model.name)
    depth = draft_depth_policy(settings, rt.target, rt.loaded.model_id)
    return ServingState(controller, settings, name, str(cfg.mapping_path), depth)


def with_serving_drafter(cfg: DictConfig) -> DictConfig:
    """The server's default drafter, when the command names none: the model's default drafter
    with its size chosen for this machine (``num_tokens: auto``: prompt lookup's chain length
    chosen per step from measured latency tables and the request's own acceptance,
    docs/serving.md). The search keeps the fixed size its protocol needs; ``drafter=...`` on
    the command line is used as given."""
    if cfg.get("drafter") is not None:
        return cfg
    drafter = drafter_config(cfg)
    if "max_tokens" in drafter:  # a chain drafter that can be sized to the hardware (num_tokens: auto)
        drafter["num_tokens"] = "auto"
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.drafter = OmegaConf.create(drafter)
    log.info("serving with drafter %s (num_tokens=%s; drafter=... chooses another)", drafter.get("name"), drafter.get("num_tokens"))
    return cfg


def build_vllm_launch(cfg: DictConfig, vllm_args: list[str] | None = None) -> VLLMLaunch:
    """Check everything vLLM's server would fail on late (vLLM, the host and key rule, the port,
    the mapping against the model, the head size) and return what it starts with.

    Args:
        cfg: The serve command's configuration (``backend=vllm``).
        vllm_args: vLLM options given after ``--`` (appended to ``cfg.vllm_args``).

    Raises:
        UsageError: vLLM missing, bad settings, a port in use, an unsupported head size.
        MappingError: Missing, corrupt or other-model mapping.
    """
    import json
    from pathlib import Path

    from tss_opt.models.loading import model_id_for
    from tss_opt.models.local_dir import checkpoint_dir
    from tss_opt.runtime.server.run import check_bind
    from tss_opt.runtime.server.settings import ServerSettings
    from tss_opt.runtime.vllm_plugin.launch import VLLMLaunch, check_head_dim, check_vllm
    from tss_opt.runtime.vllm_plugin.mapping_env import check_mapping

    settings = ServerSettings.from_serve(serve_settings(cfg))
    version = check_vllm()
    port = settings.port or _free_port(settings.host)
    check_bind(settings.host, port)
    mc = model_settings(cfg)  # the dtype= / device= shortcuts, dtype=auto resolved for decoding
    mapping = load_mapping(cfg.mapping_path)
    model_dir = checkpoint_dir(mc)
    hf = json.loads((Path(model_dir) / "config.json").read_text()) if Path(model_dir).is_dir() else {}
    num_layers = int(hf.get("num_hidden_layers") or mc.num_layers)
    check_mapping(mapping, num_layers, model_id_for(mc))
    note = mapping.precision_note(mc.dtype)
    if note:
        log.warning("%s", note)
    if hf:
        check_head_dim(int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]), mc.device)
    log.info(
        "serving %s with vLLM %s (TSS plugin) on %s:%d; mapping %s: %s", mc.name, version, settings.host, port,
        cfg.mapping_path, ", ".join(f"{d} -> {list(mapping.skip_set_for(d))}" for d in mapping.domains) or "no domains",
    )
    return VLLMLaunch(
        model_dir=model_dir,
        served_model_name=settings.served_model_name or str(mc.name),
        model_id=model_id_for(mc),
        dtype=mc.dtype,
        host=settings.host,
        port=port,
        api_key=settings.api_key,
        mapping_path=str(cfg.mapping_path),
        system_prompts=domain_system_prompts(mapping.domains, chosen_domain(cfg)),
        vllm_args=tuple([*(cfg.get("vllm_args") or []), *(vllm_args or [])]),
        cpu=str(mc.device).startswith("cpu"),
    )


def _free_port(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return int(s.getsockname()[1])
