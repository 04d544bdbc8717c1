"""Starting the server: settings checked first, the model, mapping and router loaded once
(:func:`tss_opt.assembly.serving.build_state`, from the configuration), then uvicorn until
SIGTERM or Ctrl-C.

uvicorn runs with the connection guard of ``connections.py`` as its HTTP protocol (deadlines
for headers, bodies and idle connections; room for new connections) instead of its
``limit_concurrency``, which answers every request 503 once that many connections are open.
:class:`DrainingServer` turns the first SIGTERM (or Ctrl-C) into a graceful shutdown
(:meth:`ServingState.drain`, then uvicorn's own) that exits with status 0; a second signal
stops at once, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from tss_opt.errors import UsageError
from tss_opt.runtime.server.app import ServingState, create_app
from tss_opt.runtime.server.connections import ConnectionLimits, guarded_protocol
from tss_opt.runtime.server.settings import ServerSettings

if TYPE_CHECKING:
    from tss_opt.decoding.batch_budget import DepthPolicy

__all__ = ["DrainingServer", "check_bind", "draft_depth_policy", "make_server", "run_server", "uvicorn_config"]

# uvicorn's own wait for open connections once the drain answered every request.
UVICORN_GRACE_S = 5

log = logging.getLogger(__name__)


def draft_depth_policy(settings: ServerSettings, target: Any, model_name: str | None = None) -> DepthPolicy | None:
    """``batch_draft`` as the scheduler's depth policy: ``auto`` reads (or measures once, about
    half a minute for SmolLM2 on a CPU) this machine's batch latency table; ``solo``: none."""
    from tss_opt.decoding.batch_budget import DepthPolicy, load_or_measure_batch_latency

    if settings.batch_draft == "solo":
        return None
    if settings.draft_cap is not None:
        return DepthPolicy(fixed=settings.draft_cap)
    return DepthPolicy(latency=load_or_measure_batch_latency(target, model_name=model_name))


def uvicorn_config(state: ServingState, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for ``state``: the guarded h11 protocol (``timeout_header``,
    ``timeout_body``, ``timeout_keep_alive``, ``max_connections``); uvicorn's loggers go
    through the command's logging (no second config)."""
    s = state.settings
    limits = ConnectionLimits(
        timeout_header=s.timeout_header, timeout_body=s.timeout_body, timeout_keep_alive=s.timeout_keep_alive,
        max_connections=s.max_connections,
    )
    closed = state.metrics.connections_closed
    return uvicorn.Config(
        create_app(state), host=s.host, port=s.port, timeout_keep_alive=s.timeout_keep_alive,
        http=guarded_protocol(limits, lambda reason: closed.labels(reason=reason).inc()), ws="none",
        log_config=None, log_level=log_level.lower(), server_header=False, date_header=False,
        # No limit_concurrency: beyond it uvicorn answers every request 503, /health included
        # while they last; max_connections makes room by closing connections not being answered.
        limit_concurrency=None,
        timeout_graceful_shutdown=UVICORN_GRACE_S,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the first SIGTERM or Ctrl-C draining ``state`` first.

    The drain (:meth:`ServingState.drain`) keeps the listener open, so a request arriving
    meanwhile gets a 503 with ``Retry-After`` rather than a refused connection; then uvicorn
    shuts down as usual. The signal is not re-raised afterwards (uvicorn does that, which
    made SIGTERM end the process with status -15): the exit status is 0.
    """

    def __init__(self, config: uvicorn.Config, state: ServingState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self.drain_started = False
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started or self.should_exit or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal (or before start): uvicorn's own
            return
        self.drain_started = True
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        log.info("%s: shutting down", signal.Signals(sig).name)
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.state.drain(self.state.settings.shutdown_grace)
        finally:
            self.should_exit = True


def make_server(state: ServingState, log_level: str = "info") -> DrainingServer:
    """The server for ``state`` (not started: ``.run()`` blocks until shut down)."""
    return DrainingServer(uvicorn_config(state, log_level), state)


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
    """Serve until SIGTERM or Ctrl-C (drained: see :class:`DrainingServer`).

    Raises:
        UsageError: The address cannot be bound.
    """
    check_bind(state.settings.host, state.settings.port)
    state.settings.warn_if_open()
    c = state.controller
    port = state.settings.port or "<a free port: see the line below>"
    log.info(
        "serving %s on http://%s:%s (domains: %s; router: %s; API key: %s)", state.model_name, state.settings.host,
        port, ", ".join(c.domains) or "none", "yes" if c.router is not None else "no",
        "required" if state.settings.api_key else "none",
    )
    make_server(state, log_level).run()
