"""Starting the server: settings checked first, the model, mapping and router loaded once,
then uvicorn until Ctrl-C."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tss_opt.errors import UsageError

if TYPE_CHECKING:
    from tss_opt.decoding.batch_budget import DepthPolicy
from tss_opt.runtime.server.app import ServingState, create_app
from tss_opt.runtime.server.settings import ServerSettings

__all__ = ["build_state", "check_bind", "draft_depth_policy", "run_server", "uvicorn_config", "with_serving_drafter"]

log = logging.getLogger(__name__)


def build_state(cfg: Any) -> ServingState:
    """Check the settings (before loading anything: a refused start costs nothing), then load
    the model, drafter, mapping and router (fitted or loaded now, not on the first request).

    Raises:
        UsageError: Bad settings (a non-loopback host without a key, a port in use...).
        MappingError: Missing, corrupt or other-model mapping.
    """
    from tss_opt.assembly import assemble
    from tss_opt.mapping import load_mapping
    from tss_opt.runtime.controller import TSSController
    from tss_opt.runtime.router_setup import load_or_fit_router, router_cache_path

    settings = ServerSettings.from_config(cfg)
    check_bind(settings.host, settings.port)
    load_mapping(cfg.mapping_path)  # a missing or corrupt file fails before the model loads
    cfg = with_serving_drafter(cfg)
    rt = assemble(cfg)
    controller = TSSController.from_config(cfg, runtime=rt, with_router=True)
    if controller.router is None:
        # An empty mapping needs no router yet, but a search may fill it while the server
        # runs (it is reloaded): fit the router now rather than on a request or a restart.
        controller.router = load_or_fit_router(rt, router_cache_path(cfg.mapping_path, rt.loaded.model_id))
    name = settings.served_model_name or str(cfg.model.name)
    depth = draft_depth_policy(settings, rt.target, rt.loaded.model_id)
    return ServingState(controller, settings, name, str(cfg.mapping_path), depth)


def with_serving_drafter(cfg: Any) -> Any:
    """The server's default drafter, when the command names none: the model's default drafter
    with its size chosen for this machine (``num_tokens: auto``: prompt lookup sized per
    context length from measured latency tables, the fastest lossless setting measured here,
    docs/serving.md). The search keeps the fixed size its protocol needs; ``drafter=...``
    on the command line is used as given."""
    from omegaconf import OmegaConf, open_dict

    from tss_opt.assembly.settings import drafter_config

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


def draft_depth_policy(settings: ServerSettings, target: Any, model_name: str | None = None) -> DepthPolicy | None:
    """``batch_draft`` as the scheduler's depth policy: ``auto`` reads (or measures once, about
    half a minute for SmolLM2 on a CPU) this machine's batch latency table; ``solo``: none."""
    from tss_opt.decoding.batch_budget import DepthPolicy, load_or_measure_batch_latency

    if settings.batch_draft == "solo":
        return None
    if settings.draft_cap is not None:
        return DepthPolicy(fixed=settings.draft_cap)
    return DepthPolicy(latency=load_or_measure_batch_latency(target, model_name=model_name))


def uvicorn_config(state: ServingState, log_level: str = "info") -> Any:
    """uvicorn's settings for ``state``: idle connections closed after ``timeout_keep_alive``
    seconds; uvicorn's loggers go through the command's logging (no second config)."""
    import uvicorn

    s = state.settings
    return uvicorn.Config(
        create_app(state), host=s.host, port=s.port, timeout_keep_alive=s.timeout_keep_alive,
        log_config=None, log_level=log_level.lower(), server_header=False, date_header=False,
        # Connections beyond this answer 503 at once instead of piling up file descriptors.
        limit_concurrency=max(64, 4 * s.max_queue),
        # Ctrl-C: open streams get this long to end (their requests are cancelled) before exit.
        timeout_graceful_shutdown=10,
    )


def check_bind(host: str, port: int) -> None:
    """Raise a one-line :class:`UsageError` when ``host:port`` cannot be bound (in use, or an
    address this machine does not have), instead of uvicorn's log line and exit status 1."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host.strip("[]"), port))
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another port=... or host=...") from e


def run_server(state: ServingState, log_level: str = "info") -> None:
    """Serve until interrupted.

    Raises:
        UsageError: The address cannot be bound.
    """
    import uvicorn

    check_bind(state.settings.host, state.settings.port)
    state.settings.warn_if_open()
    c = state.controller
    port = state.settings.port or "<a free port: see the line below>"
    log.info(
        "serving %s on http://%s:%s (domains: %s; router: %s; API key: %s)", state.model_name, state.settings.host,
        port, ", ".join(c.domains) or "none", "yes" if c.router is not None else "no",
        "required" if state.settings.api_key else "none",
    )
    uvicorn.Server(uvicorn_config(state, log_level)).run()
