"""Who may talk to the server and how much they may send.

- :func:`check_key`: ``Authorization: Bearer KEY``, compared in constant time
  (``hmac.compare_digest``); the key is never echoed, logged or put in an error.
- :class:`BodyLimit`: an ASGI middleware answering 413 for a body over ``max_body_bytes``
  from its ``Content-Length`` header, before anything is read; :func:`read_body` counts a
  body sent without one (chunked) while it arrives. A 10 MB body is never held in memory.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from tss_opt.runtime.server.errors import APIError

__all__ = ["BodyLimit", "check_key", "read_body", "too_large"]


def check_key(authorization: str | None, key: str | None) -> None:
    """Raise a 401 unless ``authorization`` is ``Bearer <key>`` (no key set: anything goes).

    Raises:
        APIError: 401, ``invalid_api_key``.
    """
    if not key:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise APIError(
            401, "missing API key: send the header 'Authorization: Bearer <key>' (the openai client's api_key)",
            type="authentication_error", code="invalid_api_key",
        )
    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise APIError(401, "incorrect API key", type="authentication_error", code="invalid_api_key")


def too_large(size: str, max_bytes: int) -> APIError:
    return APIError(
        413, f"request body of {size} is over the limit of {max_bytes} bytes (max_body_bytes); send a shorter prompt",
        code="request_too_large",
    )


async def read_body(request: Any, max_bytes: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``max_bytes``.

    Raises:
        APIError: 413 (too large); 408 when the connection closed before the body's end
            (the client left, or the server closed it at ``timeout_body``).
    """
    from starlette.requests import ClientDisconnect

    chunks, seen = [], 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > max_bytes:
                raise too_large(f"more than {max_bytes} bytes", max_bytes)
            chunks.append(chunk)
    except ClientDisconnect as e:
        raise APIError(
            408, f"the request body ended after {seen} bytes: the connection closed (the client left, or the body did "
            "not arrive within timeout_body)", code="request_timeout",
        ) from e
    return b"".join(chunks)


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413 in OpenAI's error shape.

    Args:
        app: The ASGI app it wraps.
        max_bytes: The largest body accepted.
        on_refused: Called once per refused request (metrics).
    """

    def __init__(self, app: Any, max_bytes: int, on_refused: Any = None) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)
        self.on_refused = on_refused

    async def _refuse(self, send: Any, size: str) -> None:
        if self.on_refused:
            self.on_refused()
        body = json.dumps(too_large(size, self.max_bytes).body()).encode()
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > self.max_bytes:
                await self._refuse(send, f"{n} bytes")
                return
        await self.app(scope, receive, send)
