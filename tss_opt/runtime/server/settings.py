"""The server's settings, read once at start, and its start-up checks (key, bind address).

A key may come from the ``api_key`` setting or, preferably, the ``TSS_API_KEY`` environment
variable (a key in argv shows in ``ps``). Binding beyond loopback without a key is refused
unless ``allow_open=true``: an open endpoint on a shared network hands anyone the model, the
mapping and other people's prompts.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from tss_opt.config.serve import ServeSettings
from tss_opt.errors import UsageError

__all__ = ["API_KEY_ENV", "ServerSettings", "is_loopback"]

log = logging.getLogger(__name__)

API_KEY_ENV = "TSS_API_KEY"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


@dataclass(frozen=True)
class ServerSettings:
    """What the server needs, as one value (see :class:`tss_opt.config.serve.ServeSettings`
    for each field's meaning). ``api_key`` is never printed: ``repr`` hides it."""

    # The defaults are the config schema's (one place for each value).
    host: str = ServeSettings.host
    port: int = ServeSettings.port
    api_key: str | None = ServeSettings.api_key
    allow_open: bool = ServeSettings.allow_open
    metrics_auth: bool = ServeSettings.metrics_auth
    max_queue: int = ServeSettings.max_queue
    max_batch: int = ServeSettings.max_batch
    batch_draft: str = ServeSettings.batch_draft
    max_tokens_cap: int = ServeSettings.max_tokens_cap
    max_body_bytes: int = ServeSettings.max_body_bytes
    timeout_keep_alive: int = ServeSettings.timeout_keep_alive
    timeout_header: float = ServeSettings.timeout_header
    timeout_body: float = ServeSettings.timeout_body
    max_connections: int = ServeSettings.max_connections
    shutdown_grace: float = ServeSettings.shutdown_grace
    served_model_name: str | None = ServeSettings.served_model_name

    def __repr__(self) -> str:
        key = "set" if self.api_key else "none"
        return (
            f"ServerSettings(host={self.host!r}, port={self.port}, api_key=<{key}>, allow_open={self.allow_open}, "
            f"max_queue={self.max_queue}, max_batch={self.max_batch}, batch_draft={self.batch_draft}, max_tokens_cap={self.max_tokens_cap}, max_body_bytes={self.max_body_bytes})"
        )

    __str__ = __repr__

    @classmethod
    def from_serve(cls, serve: ServeSettings, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """The server's settings from the configuration's serve keys (read at the command
        layer: :func:`tss_opt.config.serve.serve_settings`) and ``TSS_API_KEY``, checked.

        Raises:
            UsageError: A value out of range, two different keys, or a non-loopback ``host``
                without a key and without ``allow_open=true``.
        """
        env = os.environ if environ is None else environ
        setting = serve.api_key or None
        from_env = env.get(API_KEY_ENV) or None
        if setting and from_env and setting != from_env:
            raise UsageError(
                f"api_key and {API_KEY_ENV} are both set and differ; keep one (prefer {API_KEY_ENV}: a key in argv shows in ps)"
            )
        s = cls(**{**{f.name: getattr(serve, f.name) for f in fields(ServeSettings)}, "api_key": setting or from_env})
        s.check()
        return s

    def check(self) -> None:
        """Refuse settings the server cannot start with (one line each, naming the fix)."""
        for name, low in (
            ("max_queue", 1), ("max_batch", 1), ("max_tokens_cap", 1), ("max_body_bytes", 1024),
            ("timeout_keep_alive", 1), ("max_connections", 8),
        ):
            value = getattr(self, name)
            if value < low:
                raise UsageError(f"{name}={value}; expected an integer >= {low}")
        if self.draft_cap is None and self.batch_draft not in ("auto", "solo"):
            raise UsageError(
                f"batch_draft={self.batch_draft!r}; expected auto (measured per step), solo (rows draft as alone) "
                "or an integer cap >= 0 (0: no drafting in a batch)"
            )
        for name in ("timeout_header", "timeout_body"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name}={getattr(self, name)}; expected a number of seconds > 0")
        if not self.shutdown_grace >= 0:
            raise UsageError(f"shutdown_grace={self.shutdown_grace}; expected a number of seconds >= 0")
        if not 0 <= self.port <= 65535:
            raise UsageError(f"port={self.port}; expected 0-65535 (0 picks a free port)")
        if not is_loopback(self.host) and not self.api_key and not self.allow_open:
            raise UsageError(
                f"host={self.host} is reachable beyond this machine and no API key is set: set {API_KEY_ENV} "
                f"(or api_key=...), or pass allow_open=true to serve without one"
            )

    @property
    def draft_cap(self) -> int | None:
        """``batch_draft`` as a fixed depth cap (``None`` for ``auto`` and ``solo``)."""
        try:
            cap = int(self.batch_draft)
        except ValueError:
            return None
        return cap if cap >= 0 else None

    def warn_if_open(self) -> None:
        """The one start-up warning of an open non-loopback server."""
        if not is_loopback(self.host) and not self.api_key:
            log.warning(
                "serving on %s without an API key (allow_open=true): anyone who can reach this address can use "
                "the model; set %s to require a key", self.host, API_KEY_ENV,
            )
