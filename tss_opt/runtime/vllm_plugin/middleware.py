"""The OpenAI server's TSS surface: vLLM's own server, wrapped by one ASGI middleware.

vLLM's server (``--middleware tss_opt.runtime.vllm_plugin.middleware.TSSMiddleware``, set by
``python -m tss_opt.cli.serve backend=vllm``) drops request fields it does not know, so our
API's top-level ``"domain"`` would be lost and its answers would carry no ``tss`` object. For
``POST /v1/chat/completions`` and ``/v1/completions`` the middleware

1. reads the domain from the top-level ``"domain"`` field or from ``vllm_xargs``
   (``tss_domain``, ``tss_skip``, ``tss_scope``), checks them and resolves the skip set from
   the mapping (``request_args.resolve``); a malformed field is a 400 naming it (``param``),
   answered here, before vLLM sees the request;
2. forwards the request with the resolved set as explicit ``vllm_xargs`` (the engine's front
   end checks it again and carries it to the workers) and, for a chat request of a domain with
   a ``system_prompt`` and no system message, that prompt first, as the native server does;
3. adds the ``tss`` object to the answer: the JSON body's ``"tss"`` key, or, in a stream, one
   more chunk before ``data: [DONE]`` (no choices, the stream's id, ``"tss"``).

``GET /tss/layer_counts`` returns the workers' per-layer counts (steps a layer ran dense,
skipped, mixed; tokens whose MLP was skipped) through vLLM's ``collective_rpc``.

A request without the server's API key passes through untouched, so that vLLM answers 401
before anything here reads its body.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tss_opt.runtime.vllm_plugin.request_args import (
    DOMAIN_KEY,
    SCOPE_KEY,
    SKIP_KEY,
    TSSArgsError,
    TSSRequest,
    resolve,
)

__all__ = ["SYSTEM_PROMPTS_ENV", "TSSMiddleware"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

GENERATION_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "text"}
COUNTS_PATH = "/tss/layer_counts"
# Per domain, the system message its chat requests get (JSON, written by the launch command).
SYSTEM_PROMPTS_ENV = "TSS_SYSTEM_PROMPTS"


class TSSMiddleware:
    """ASGI middleware around vLLM's OpenAI app (see the module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self._source: Any = None
        self.keys = [k for k in (os.environ.get("VLLM_API_KEY"),) if k]
        self.system_prompts: dict[str, str] = {
            d: p for d, p in json.loads(os.environ.get(SYSTEM_PROMPTS_ENV) or "{}").items() if p
        }

    # ------------------------------------------------------------------------------ helpers
    def _authorized(self, scope: Scope) -> bool:
        if not self.keys:
            return True
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        token = auth[7:] if auth.lower().startswith("bearer ") else ""
        return any(hmac.compare_digest(token, k) for k in self.keys)

    def _resolve(self, scope: Scope, body: dict[str, Any]) -> TSSRequest:
        app_state = scope["app"].state
        num_layers = int(app_state.vllm_config.model_config.hf_config.num_hidden_layers)
        if self._source is None:
            from tss_opt.runtime.vllm_plugin.mapping_env import MappingSource

            self._source = MappingSource(num_layers)
        xargs = body.get("vllm_xargs")
        if xargs is not None and not isinstance(xargs, dict):
            raise TSSArgsError("vllm_xargs", f"vllm_xargs must be an object, got {type(xargs).__name__}")
        args = dict(xargs or {})
        domain = body.get("domain")
        if domain is not None:
            if not isinstance(domain, str) or not domain.strip():
                raise TSSArgsError("domain", f"domain must be a domain name (a non-empty string), got {domain!r}")
            if args.get(DOMAIN_KEY) not in (None, domain):
                raise TSSArgsError(
                    "domain", f"domain {domain!r} and vllm_xargs.{DOMAIN_KEY} {args[DOMAIN_KEY]!r} disagree; give one"
                )
            args[DOMAIN_KEY] = domain
        try:
            return resolve(args, num_layers, self._source.get())
        except TSSArgsError as e:
            if e.param == f"vllm_xargs.{DOMAIN_KEY}" and body.get("domain") is not None:
                e.param = "domain"
            raise

    def _rewrite(self, kind: str, body: dict[str, Any], req: TSSRequest) -> dict[str, Any]:
        body = dict(body)
        body.pop("domain", None)
        xargs = {k: v for k, v in (body.get("vllm_xargs") or {}).items() if not k.startswith("tss_")}
        if req.domain is not None:
            xargs[DOMAIN_KEY] = req.domain
        if not req.dense or req.domain is not None:
            xargs[SKIP_KEY] = list(req.skip_set)
            xargs[SCOPE_KEY] = req.scope
        body["vllm_xargs"] = xargs
        if not xargs:
            body.pop("vllm_xargs")
        system = self.system_prompts.get(req.domain or "")
        messages = body.get("messages")
        if kind == "chat" and system and isinstance(messages, list) and not any(
            isinstance(m, dict) and m.get("role") == "system" for m in messages
        ):
            body["messages"] = [{"role": "system", "content": system}, *messages]
        return body

    # --------------------------------------------------------------------------------- ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope.get("path", ""), scope.get("method", "")
        if path == COUNTS_PATH and method == "GET":
            if not self._authorized(scope):
                return await _send_json(send, 401, {"error": {"message": "Unauthorized", "code": 401}})
            return await self._counts(scope, send)
        if not self._authorized(scope):  # vLLM answers 401 before anything reads the body
            return await self.app(scope, receive, send)
        kind = GENERATION_PATHS.get(path)
        if kind is None or method != "POST":
            return await self.app(scope, receive, send)
        raw = await _read_body(receive)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):  # vLLM answers its own 400 for a body it cannot read
            return await self.app(scope, _replay(raw, receive), send)
        try:
            req = self._resolve(scope, body)
        except TSSArgsError as e:
            return await _send_json(send, 400, {"error": {
                "message": str(e), "type": "BadRequestError", "param": e.param, "code": 400,
            }})
        new = json.dumps(self._rewrite(kind, body, req)).encode()
        headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(new)).encode()))
        scope = {**scope, "headers": headers}
        await self.app(scope, _replay(new, receive), _TSSResponse(send, req.info()).send)

    async def _counts(self, scope: Scope, send: Send) -> None:
        client = scope["app"].state.engine_client
        counts = await client.collective_rpc("tss_layer_counts")
        await _send_json(send, 200, {"workers": counts})


class _TSSResponse:
    """Adds the ``tss`` object to a successful JSON answer or event stream."""

    def __init__(self, send: Send, info: dict[str, Any]) -> None:
        self._send = send
        self.info = info
        self.status = 0
        self.kind = "other"
        self.start: Message | None = None
        self.body = b""
        self.pending = b""
        self.last_chunk: dict[str, Any] | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            ctype = dict(message.get("headers") or []).get(b"content-type", b"").decode("latin-1")
            if self.status == 200 and ctype.startswith("application/json"):
                self.kind, self.start = "json", message  # held until the body is complete
                return
            if self.status == 200 and ctype.startswith("text/event-stream"):
                self.kind = "stream"
            return await self._send(message)
        if message["type"] != "http.response.body":
            return await self._send(message)
        more = bool(message.get("more_body"))
        if self.kind == "json":
            self.body += message.get("body", b"")
            if more:
                return
            return await self._finish_json()
        if self.kind == "stream":
            return await self._stream(message.get("body", b""), more)
        return await self._send(message)

    async def _finish_json(self) -> None:
        body = self.body
        try:
            data = json.loads(body)
            if isinstance(data, dict):
                data["tss"] = self.info
                body = json.dumps(data).encode()
        except ValueError:
            pass
        assert self.start is not None
        headers = [(k, v) for k, v in self.start.get("headers") or [] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**self.start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _stream(self, data: bytes, more: bool) -> None:
        self.pending += data
        out = b""
        # Server-sent events end with a blank line; only whole events are inspected.
        while b"\n\n" in self.pending:
            event, self.pending = self.pending.split(b"\n\n", 1)
            text = event.decode("utf-8", "replace").strip()
            if text == "data: [DONE]" and self.last_chunk is not None:
                extra = {k: self.last_chunk[k] for k in ("id", "object", "created", "model") if k in self.last_chunk}
                out += b"data: " + json.dumps({**extra, "choices": [], "tss": self.info}).encode() + b"\n\n"
            elif text.startswith("data: {"):
                try:
                    self.last_chunk = json.loads(text[6:])
                except ValueError:
                    pass
            out += event + b"\n\n"
        if not more:
            out, self.pending = out + self.pending, b""
        if out or not more:
            await self._send({"type": "http.response.body", "body": out, "more_body": more})


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The request's (rewritten) body once, then the client's own messages, so that a client
    that goes away still reaches vLLM as a disconnect (it aborts the request then)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body, "more_body": False})
