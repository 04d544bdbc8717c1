"""Settings of the HTTP server (``python -m tss_opt.cli.serve`` without ``prompt=``).

They are top-level keys of the configuration tree (``host=0.0.0.0``, ``port=8080``,
``allow_open=true``...): :class:`~tss_opt.config.schema.TSSConfig` inherits them. Meanings and
defaults are documented in docs/serving.md (each default is written once, here). The serve
command reads them once, at start, as one typed value (:func:`serve_settings`), which
``tss_opt.runtime.server.settings.ServerSettings.from_serve`` checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ServeSettings", "serve_settings"]


@dataclass
class ServeSettings:
    """The server's keys.

    Attributes:
        host: Address to bind. Anything beyond loopback needs an API key (or ``allow_open``).
        port: TCP port (0: a free one, printed at start).
        api_key: Bearer key every ``/v1/*`` request must carry; prefer the environment
            variable ``TSS_API_KEY`` (a key in argv shows in ``ps``). ``None``: no key.
        allow_open: Start on a non-loopback ``host`` without a key (warned once).
        metrics_auth: With a key, ``/metrics`` needs it too (``false``: open, like ``/health``).
        max_queue: Requests that may wait for a place in the batch (the most waiting); one
            more answers 429.
        max_batch: Requests decoding at once in the continuous batch; waiting ones join as
            rows leave.
        batch_draft: How deep rows draft in a batched step: ``auto`` (chosen per step from
            a batch latency table measured once on this machine: drafting shrinks as the
            batch grows), ``solo`` (every row drafts what its drafter chooses alone), or an
            integer cap (``0``: batched plain decoding, no drafting).
        max_tokens_cap: The largest ``max_tokens`` a request may ask for (400 beyond).
        max_body_bytes: Largest request body (413 beyond, refused before it is read).
        timeout_keep_alive: Seconds an idle keep-alive connection is kept open.
        timeout_header: Seconds a connection has to send a request's headers, from its
            opening (or the next request's first byte); then it is closed (408 when a
            request had begun).
        timeout_body: Seconds a request's body has to arrive after its headers.
        max_connections: Open connections at most; one more closes the oldest connection
            that is not being answered (503 only when every connection is being answered).
        shutdown_grace: Seconds running requests get to finish after SIGTERM (or Ctrl-C);
            then they end with a 503 error (a stream: an error event and ``[DONE]``).
        served_model_name: The model id ``/v1/models`` lists and requests name; ``None``: the
            model config's ``name``.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allow_open: bool = False
    metrics_auth: bool = True
    max_queue: int = 16
    max_batch: int = 16
    batch_draft: str = "auto"
    max_tokens_cap: int = 1024
    max_body_bytes: int = 1_000_000
    timeout_keep_alive: int = 5
    timeout_header: float = 5.0
    timeout_body: float = 30.0
    max_connections: int = 512
    # Below Kubernetes' default terminationGracePeriodSeconds (30 s), so the server exits
    # on its own before it is killed.
    shutdown_grace: float = 25.0
    served_model_name: str | None = None


def serve_settings(cfg: Mapping[str, Any]) -> ServeSettings:
    """The serve keys of a composed configuration (or a plain mapping) as one typed value;
    a missing key takes the default above, an empty ``api_key`` is none.

    Values are converted to each default's type (``port="8080"`` from the command line is the
    integer 8080); ``api_key`` and ``served_model_name`` stay ``None`` when unset.
    """
    values: dict[str, Any] = {}
    for f in fields(ServeSettings):
        value = cfg.get(f.name, f.default)
        if value is None or f.default is None:
            values[f.name] = None if value in (None, "") else str(value)
        else:
            values[f.name] = type(f.default)(value)
    return ServeSettings(**values)
