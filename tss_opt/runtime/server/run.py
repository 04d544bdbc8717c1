"""Starting the server: settings checked first, the model, mapping and router loaded once,
then uvicorn until Ctrl-C."""

from __future__ import annotations

import logging
from typing import Any

from tss_opt.errors import UsageError
from tss_opt.runtime.server.app import ServingState, create_app
from tss_opt.runtime.server.settings import ServerSettings

__all__ = ["build_state", "check_bind", "run_server", "uvicorn_config"]

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
    rt = assemble(cfg)
    controller = TSSController.from_config(cfg, runtime=rt, with_router=True)
    if controller.router is None:
        # An empty mapping needs no router yet, but a search may fill it while the server
        # runs (it is reloaded): fit the router now rather than on a request or a restart.
        controller.router = load_or_fit_router(rt, router_cache_path(cfg.mapping_path, rt.loaded.model_id))
    name = settings.served_model_name or str(cfg.model.name)
    return ServingState(controller, settings, name, str(cfg.mapping_path))


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
