"""Connections that cannot hold the server: deadlines per phase and room for new ones.

uvicorn has no deadline for reading a request's headers, none for its body, and its
``limit_concurrency`` answers *every* request 503 once that many connections are open: 70
connections that send ``POST / HTTP/1.1\\r\\nHost: x\\r\\n`` and never finish their headers took
down ``/health`` and every client, without a key, for as long as they stayed open (forever).

:func:`guarded_protocol` builds a subclass of uvicorn's h11 protocol (passed as
``uvicorn.Config(http=...)``, so the server still starts with ``python -m tss_opt.cli.serve``)
that follows each connection through its phases and gives each its deadline:

=========  ==============================================================  ======================
phase      from                                                            closed after
=========  ==============================================================  ======================
headers    the connection opens, or the next request's first byte arrives  ``timeout_header``
body       its headers are complete, while the body is still arriving      ``timeout_body``
app        the request is complete: the app answers it                     no deadline
idle       the answer was sent (keep-alive)                                ``timeout_keep_alive``
discard    the answer was sent before the request's body ended (401...):   ``timeout_body``
           the rest of the body is read and dropped
=========  ==============================================================  ======================

Data arriving does not extend a deadline (a client trickling one byte a second is closed as
surely as a silent one). A client that stops reading its answer holds nothing either: an
answer is at most ``max_tokens_cap`` tokens (a 1,900-token stream is 108 KB), which the
kernel's send buffer takes whether or not the client reads (measured on loopback: the
transport's own buffer stayed empty), so the answer completes and the idle deadline closes
the connection. When a new connection would pass ``max_connections``, the oldest
connection that is *not* being answered (any phase but ``app``) is closed to make room; only
when every connection is being answered is the new one refused with a 503 and
``Retry-After``. So connections that never complete a request cannot keep out ``/health`` or
a client with a complete request: each arrival evicts one of them. Requests that are being
answered are bounded elsewhere (the queue's 429, quick routes).

uvicorn's internals used here (one module, this one): ``H11Protocol.connection_made``,
``data_received``, ``handle_events``, ``on_response_complete``, ``connection_lost`` and its
attributes ``cycle`` (``more_body``, ``response_complete``), ``conn`` (the ``h11``
connection), ``transport``, ``connections`` and ``loop``; tests/runtime/test_server_robustness.py
fails when they change.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tss_opt.runtime.server.errors import error_body

__all__ = ["ConnectionLimits", "guarded_protocol"]

log = logging.getLogger(__name__)

# Phases whose connection may be closed to make room for a new one (all but "app").
EVICTABLE = ("headers", "body", "idle", "discard")


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines (seconds) and the connection cap; see the module docstring.

    Attributes:
        timeout_header: From connection (or the next request's first byte) to complete headers.
        timeout_body: From complete headers to the complete body.
        timeout_keep_alive: An idle kept-alive connection.
        max_connections: Open connections at most.
    """

    timeout_header: float = 5.0
    timeout_body: float = 30.0
    timeout_keep_alive: float = 5.0
    max_connections: int = 512


def guarded_protocol(limits: ConnectionLimits, on_close: Callable[[str], None] | None = None) -> type[H11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``.

    Args:
        limits: Deadlines and the connection cap.
        on_close: Called with the reason of each connection the server closes
            (``header_timeout``, ``body_timeout``, ``evicted``, ``refused``;
            ``idle_timeout`` is not reported: the normal end of a kept-alive connection).
    """
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"limits": limits, "on_close": staticmethod(on_close) if on_close else None})


class _GuardedH11Protocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]
    on_close: ClassVar[Callable[[str], None] | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phase = "headers"
        self.since = 0.0  # loop time the phase began (eviction: the oldest goes first)
        self._got_bytes = False  # bytes of the current request's headers arrived
        self._deadline: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------------------- phases
    def _enter(self, phase: str) -> None:
        self.phase, self.since = phase, self.loop.time()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        seconds = {
            "headers": self.limits.timeout_header,
            "body": self.limits.timeout_body,
            "discard": self.limits.timeout_body,
            "idle": self.limits.timeout_keep_alive,
        }.get(phase)
        if seconds is not None:
            self._deadline = self.loop.call_later(seconds, self._expire, phase)

    def _expire(self, phase: str) -> None:
        if self.phase != phase or self.transport.is_closing():
            return
        if phase == "headers" and self._got_bytes:
            # A request was started but its headers never finished: tell the client why.
            self._write_raw(408, "Request Timeout", f"the request headers did not arrive within {self.limits.timeout_header:g} s "
                            "(timeout_header); send the whole request at once")
        reason = {"headers": "header_timeout", "body": "body_timeout", "discard": "body_timeout"}.get(phase, "idle_timeout")
        self._close(reason)

    def _close(self, reason: str) -> None:
        log.debug("closing connection from %s: %s", self.client, reason)
        if self.on_close is not None and reason != "idle_timeout":
            self.on_close(reason)
        self.transport.close()

    def _write_raw(self, status: int, phrase: str, message: str, retry_after: int | None = None) -> None:
        """An answer outside any request (the connection is closed right after)."""
        body = json.dumps(error_body(message, "server_error" if status >= 500 else "invalid_request_error")).encode()
        head = [f"HTTP/1.1 {status} {phrase}", "content-type: application/json", f"content-length: {len(body)}", "connection: close"]
        if retry_after is not None:
            head.append(f"retry-after: {retry_after}")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def _make_room(self) -> None:
        """Close the oldest connection not being answered when this one passes the cap;
        refuse this one when every other is being answered."""
        others = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        if len(others) < self.limits.max_connections:
            return
        idle = [c for c in others if getattr(c, "phase", "app") in EVICTABLE]
        if idle:
            min(idle, key=lambda c: c.since)._close("evicted")
            return
        self._write_raw(
            503, "Service Unavailable",
            f"{len(others)} connections are being answered (max_connections); retry shortly", retry_after=1,
        )
        self._close("refused")

    # ------------------------------------------------------------------- uvicorn's hooks
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._enter("headers")
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.phase = "closed"
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase == "idle":  # the next request begins: its headers' deadline starts now
            self._got_bytes = False
            self._enter("headers")
        if self.phase == "headers" and data:
            self._got_bytes = True
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.transport.is_closing():
            return
        if self.cycle is not cycle and self.cycle is not None:  # a request's headers are complete
            self._enter("body" if self.cycle.more_body else "app")
        elif self.phase == "body" and self.cycle is not None and not self.cycle.more_body:
            self._enter("app")
        elif self.phase == "discard" and self.conn.their_state is h11.IDLE:
            self._enter("idle")  # the refused request's body ended: the connection can be reused

    def on_response_complete(self) -> None:
        unread_body = self.conn.their_state is h11.SEND_BODY
        super().on_response_complete()
        if self.transport.is_closing() or self.phase != "app" and self.phase != "body":
            return  # closed, or a pipelined request already started
        if unread_body:
            # Answered before its body arrived (401, 413...): the rest is discarded, for at
            # most timeout_body (after a 413 on a chunked body the connection stayed open
            # for minutes).
            self._enter("discard")
        else:
            self._got_bytes = False
            self._enter("idle")
