"""The HTTP routes: OpenAI's completions, chat completions and models, plus health and metrics.

:class:`ServingState` holds what the routes share (controller, worker, metrics, settings);
:func:`create_app` builds the FastAPI app over it. Requests are validated and tokenized on
the event loop, then queued for the scheduler's continuous batch (``worker.py``); the route awaits
the worker's events and answers in OpenAI's shapes (``schemas.py``). Every refusal is an
:class:`~tss_opt.runtime.server.errors.APIError` in OpenAI's error shape; an unexpected
failure answers 500 in the same shape and the server keeps serving.

429 and 503 carry ``Retry-After`` (how long to wait). :meth:`ServingState.drain` is the shutdown
(``run.py`` calls it on SIGTERM): new requests 503, waiting ones 503, running ones finish
within ``shutdown_grace`` or end with a 503 error (a stream: an error event, then
``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tss_opt.decoding.batch_budget import DepthPolicy
from tss_opt.runtime.chat import chat_ids
from tss_opt.runtime.controller import TSSController
from tss_opt.runtime.server.errors import APIError
from tss_opt.runtime.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from tss_opt.runtime.server.reload import MappingReloader
from tss_opt.runtime.server.schemas import (
    GenerationRequest,
    TSSInfo,
    Usage,
    chunk_body,
    models_body,
    new_id,
    parse_json,
    parse_request,
    response_body,
    sse,
)
from tss_opt.runtime.server.security import BodyLimit, check_key, read_body
from tss_opt.runtime.server.settings import ServerSettings
from tss_opt.runtime.server.text import TextTracker
from tss_opt.runtime.server.worker import Event, GenerationWorker, Job, QueueFull

__all__ = ["ServingState", "create_app"]

log = logging.getLogger(__name__)

# How often a non-streamed request checks that its client is still there.
DISCONNECT_POLL_S = 0.5
# Retry-After bounds (seconds): the openai client honours up to 60.
RETRY_AFTER_MIN, RETRY_AFTER_MAX = 1, 60
# After the grace period, how long cut requests get to write their last event.
CUT_FLUSH_S = 5.0


class ServingState:
    """One loaded model behind the HTTP routes.

    Args:
        controller: Loaded once at start (model, drafter factory, mapping, router).
        settings: The server's settings.
        model_name: The id ``/v1/models`` lists; requests may also name ``controller.model_id``.
        mapping_path: The file to watch for a new mapping (``None``: no reload).
        draft_depth: How deep rows draft in a batched step (``run.draft_depth_policy``;
            ``None``: every row drafts as alone).
    """

    def __init__(
        self,
        controller: TSSController,
        settings: ServerSettings,
        model_name: str,
        mapping_path: str | None = None,
        draft_depth: DepthPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.model_name = model_name
        self.created = int(time.time())
        self.worker = GenerationWorker(self.current_controller, settings.max_queue, settings.max_batch, draft_depth)
        self.metrics = ServerMetrics(
            lambda: self.worker.depth, lambda: self._controller.domains, lambda: self.worker.batch_size,
            self.worker.rows_per_skip_set,
        )
        self.reloader = (
            MappingReloader(controller, mapping_path, lambda r: self.metrics.reloads.labels(result=r).inc())
            if mapping_path else None
        )
        self._controller = controller
        # Submitted and not yet answered, by id() (Job is a dataclass: unhashable); what a
        # shutdown waits for.
        self.jobs: dict[int, Job] = {}
        self.draining_until: float | None = None  # loop time the shutdown grace ends; None: serving
        self._service_s = 0.0  # running mean of one request's decoding seconds (Retry-After)
        self._background: set[asyncio.Task[None]] = set()

    def current_controller(self) -> TSSController:
        """The controller for the next job (the worker calls it; reloads a changed mapping)."""
        if self.reloader is not None:
            self._controller = self.reloader.check()
        return self._controller

    @property
    def controller(self) -> TSSController:
        return self._controller

    @property
    def vocab_size(self) -> int:
        """Token ids of a completions prompt are below this (checked when the body is parsed)."""
        return int(self._controller.target.model.config.vocab_size)

    @property
    def draining(self) -> bool:
        return self.draining_until is not None

    # ------------------------------------------------------------------------ Retry-After
    def retry_after(self, status: int) -> int:
        """Seconds a refused client should wait: 429, about one request's decoding time over
        the rows decoding (a queue slot frees when the first of the batch's rows ends); 503
        (shutting down), what is left of the grace period."""
        if status == 503 and self.draining_until is not None:
            seconds = self.draining_until - asyncio.get_running_loop().time()
        else:
            seconds = self._service_s / max(1, self.worker.batch_size)
        return int(min(RETRY_AFTER_MAX, max(RETRY_AFTER_MIN, math.ceil(seconds))))

    def observe_service(self, new_tokens: int, tokens_per_s: float) -> None:
        if tokens_per_s > 0:
            s = new_tokens / tokens_per_s
            self._service_s = s if self._service_s == 0 else 0.8 * self._service_s + 0.2 * s

    # ------------------------------------------------------------------------ requests
    def check_model(self, model: str | None) -> None:
        names = {self.model_name, self._controller.model_id}
        if model is not None and model not in names:
            raise APIError(
                404, f"model {model!r} is not served here; use {self.model_name!r} (GET /v1/models)",
                type="not_found_error", param="model", code="model_not_found",
            )

    def prompt_of(self, req: GenerationRequest) -> tuple[torch.Tensor | list[dict[str, str]], int]:
        """What the controller generates from and the prompt's length in tokens (before a
        domain's system prompt, which the worker adds once the domain is known)."""
        c = self._controller
        if req.kind == "chat":
            assert req.messages is not None
            try:
                return req.messages, int(chat_ids(c.tokenizer, req.messages).numel())
            except Exception as e:  # a template that refuses this conversation (roles out of order...)
                raise APIError(400, f"the chat template cannot format these messages: {e}", param="messages") from e
        if isinstance(req.prompt, str):
            ids = torch.as_tensor(c.tokenizer(req.prompt)["input_ids"], dtype=torch.long).reshape(-1)
        else:  # ids below the vocabulary: checked when the body was parsed
            ids = torch.as_tensor(req.prompt, dtype=torch.long)
        if ids.numel() == 0:
            raise APIError(400, "prompt has no tokens; give some text", param="prompt")
        return ids, int(ids.numel())

    def make_job(self, req: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Job:
        """Validate the request against the model and the limits and queue it.

        Raises:
            APIError: 400 (too long, max_tokens over the cap), 404 (model), 429 (queue full),
                503 (shutting down).
        """
        self.refuse_if_draining()
        self.check_model(req.model)
        c, s = self._controller, self.settings
        max_tokens = req.max_tokens if req.max_tokens is not None else min(c.max_new_tokens, s.max_tokens_cap)
        if max_tokens > s.max_tokens_cap:
            raise APIError(
                400, f"max_tokens={max_tokens} is over this server's cap of {s.max_tokens_cap} (max_tokens_cap); ask for fewer",
                param="max_tokens",
            )
        prompt, n = self.prompt_of(req)
        limit = c.target.max_context
        if not c.target.fits(n, max_tokens):
            raise APIError(
                400, f"{req.prompt_param} has {n} tokens; with max_tokens={max_tokens} that needs {c.target.positions_needed(n, max_tokens)} "
                f"positions but the model's context is {limit}. Shorten the prompt or lower max_tokens.",
                param=req.prompt_param, code="context_length_exceeded",
            )
        job = Job(
            prompt=prompt, domain=req.domain, max_tokens=max_tokens, temperature=req.temperature, seed=req.seed,
            tracker=TextTracker(c.tokenizer, req.stop), stream=req.stream, loop=loop, eos_token_ids=c.eos_token_ids,
            prompt_param=req.prompt_param,
        )
        try:
            self.worker.submit(job)
        except QueueFull as e:
            self.refuse_if_draining()
            raise APIError(
                429, f"{s.max_queue} requests are already waiting (max_queue); retry after the Retry-After header's seconds",
                type="rate_limit_error", code="queue_full",
            ) from e
        self.jobs[id(job)] = job
        return job

    # ------------------------------------------------------------------------ shutdown
    def refuse_if_draining(self) -> None:
        if self.draining:
            raise shutting_down("the server is shutting down and takes no new requests; retry (another replica, or "
                                "this address once it is back)")

    async def drain(self, grace_s: float) -> None:
        """Shut down (SIGTERM): take no new request (503), answer the waiting ones 503, let
        the running ones finish for up to ``grace_s`` seconds, then end them with a 503 error
        (a stream: an error event and ``data: [DONE]``). Returns when every request is
        answered (or ``CUT_FLUSH_S`` after the grace period, for clients that stopped reading).
        """
        loop = asyncio.get_running_loop()
        self.draining_until = loop.time() + grace_s
        waiting = self.worker.drain(shutting_down("the server is shutting down; this request had not started; retry"))
        log.info(
            "shutting down: %d waiting requests refused; %d running get up to %gs (shutdown_grace)",
            waiting, max(0, len(self.jobs) - waiting), grace_s,
        )
        while self.jobs and loop.time() < self.draining_until:
            await asyncio.sleep(0.05)
        if self.jobs:
            log.warning("shutdown_grace=%gs is over: ending %d running requests with 503", grace_s, len(self.jobs))
        cut = shutting_down(f"the server shut down before this request finished (shutdown_grace={grace_s:g}s); retry")
        for job in list(self.jobs.values()):
            job.cancel()
            job.events.put_nowait(Event("shutdown", error=cut))
        flush_until = loop.time() + CUT_FLUSH_S
        while self.jobs and loop.time() < flush_until:
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------------ abandoned jobs
    def abandon(self, job: Job, endpoint: str, last: Event | None = None) -> None:
        """A request that ends without its answer (its client left, the shutdown cut it, the
        worker cancelled it): the job is cancelled and the tokens it generated are counted
        (``tss_generated_tokens_total``, ``tss_requests_cancelled_total``): from ``last``, the
        worker's last event when it was read, else once the worker stops the job."""
        job.cancel()
        if last is not None:
            self._count(job, endpoint, last)
            return
        task = asyncio.ensure_future(self._count_when_stopped(job, endpoint))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _count_when_stopped(self, job: Job, endpoint: str) -> None:
        while True:
            ev = await job.events.get()
            if ev.kind in ("done", "cancelled", "error"):
                self._count(job, endpoint, ev)
                return

    def _count(self, job: Job, endpoint: str, last: Event) -> None:
        res = last.result if last.kind in ("done", "cancelled") else None
        self.metrics.cancelled_request(endpoint, res.domain if res else job.domain, int(res.stats.new_tokens) if res else 0)


def shutting_down(message: str) -> APIError:
    return APIError(503, message, type="server_error", code="server_shutting_down")


def _finish(job: Job, res: Any) -> tuple[str, Usage, TSSInfo]:
    """``finish_reason`` (OpenAI's: ``stop`` at EOS or a stop string, ``length`` at
    ``max_tokens``), usage and the ``tss`` object of a finished job."""
    n = int(res.stats.new_tokens)
    eos = bool(n) and int(res.tokens[-1]) in job.eos_token_ids
    reason = "stop" if job.tracker.stopped or eos or n < job.max_tokens else "length"
    usage = Usage(prompt_tokens=int(res.stats.prompt_tokens), completion_tokens=n)
    tss = TSSInfo(
        domain=res.domain, skip_set=sorted(res.skip_set), routed=bool(res.routed),
        accept_length=float(res.stats.accept_length), tokens_per_s=float(res.stats.tokens_per_s),
        steps=int(res.stats.steps), layer_forwards=int(res.stats.verify_layer_forwards),
    )
    return reason, usage, tss


def create_app(state: ServingState) -> FastAPI:
    """The FastAPI app serving ``state`` (its worker starts and stops with the app)."""
    settings = state.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.worker.start()
        try:
            yield
        finally:
            state.worker.stop()

    app = FastAPI(title="tss_opt", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes,
        on_refused=lambda: state.metrics.errors.labels(status="413").inc(),
    )

    def refuse(e: APIError) -> JSONResponse:
        state.metrics.errors.labels(status=str(e.status)).inc()
        headers: dict[str, str] = {}
        if e.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if e.status in (429, 503):
            headers["Retry-After"] = str(state.retry_after(e.status))
        if e.status in (408, 413):
            # The body was not read to its end: the connection cannot carry another request.
            headers["Connection"] = "close"
        return JSONResponse(e.body(), status_code=e.status, headers=headers or None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return refuse(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {e.detail}"
        if e.status_code == 404:
            msg += "; the endpoints are /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics"
        return refuse(APIError(e.status_code, msg, type=kind))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return refuse(APIError(400, f"invalid request: {e.errors()}"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return refuse(APIError(500, f"internal error ({type(e).__name__}); see the server log", type="server_error"))

    def authorize(request: Request) -> None:
        check_key(request.headers.get("authorization"), settings.api_key)

    # ------------------------------------------------------------------------ open routes
    @app.get("/health")
    async def health() -> Response:
        c = state.controller
        body = {
            "status": "draining" if state.draining else "ok",
            "model": state.model_name,
            "domains": c.domains,
            "router": c.router is not None,
            "queue_depth": state.worker.depth,
            "batch_size": state.worker.batch_size,
            "max_batch": settings.max_batch,
            "busy": state.worker.busy,
        }
        if state.draining:  # load balancers take a shutting-down server out of rotation
            return JSONResponse(body, status_code=503, headers={"Retry-After": str(state.retry_after(503))})
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if settings.metrics_auth:
            authorize(request)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------------ OpenAI routes
    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return models_body([state.model_name], state.created)

    async def generate(request: Request, kind: str, endpoint: str) -> Response:
        authorize(request)  # before reading the body: no key, nothing read, nothing generated
        state.refuse_if_draining()
        t0 = time.perf_counter()
        body = parse_json(await read_body(request, settings.max_body_bytes))
        req = parse_request(body, kind, vocab_size=state.vocab_size)  # type: ignore[arg-type]
        job = state.make_job(req, asyncio.get_running_loop())
        rid = new_id(req.kind)
        if req.stream:
            return StreamingResponse(
                _stream(state, job, req, rid, endpoint, t0), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            res = await _wait(job, request)
        except _Abandoned as e:
            state.abandon(job, endpoint, e.last)
            if e.error is None:  # the client left: nobody to answer
                return Response(status_code=499)
            raise e.error from None
        finally:
            state.jobs.pop(id(job), None)
        reason, usage, tss = _finish(job, res)
        state.observe_service(usage.completion_tokens, tss.tokens_per_s)
        state.metrics.served(endpoint, res.domain, usage.completion_tokens, tss.accept_length, time.perf_counter() - t0)
        log.info(
            "%s %s: domain=%s routed=%s tokens=%d/%d accept=%.2f %.2fs", rid, endpoint, res.domain or "none",
            res.routed, usage.prompt_tokens, usage.completion_tokens, tss.accept_length, time.perf_counter() - t0,
        )
        return JSONResponse(response_body(req, rid, state.model_name, job.tracker.text, reason, usage, tss))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completion", "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat", "chat_completions")

    return app


class _Abandoned(Exception):
    """The request ends without its answer: its client left (``error`` is ``None``), the
    shutdown cut it or the worker cancelled it (``error``: the 503 to answer). ``last``: the
    worker's last event, when it was read."""

    def __init__(self, error: APIError | None = None, last: Event | None = None) -> None:
        super().__init__()
        self.error = error
        self.last = last


async def _wait(job: Job, request: Request) -> Any:
    """The job's result.

    Raises:
        APIError: The worker's error (or the shutdown's 503 for a job that had not started).
        _Abandoned: The client disconnected first, the shutdown cut the job, or the worker
            cancelled it (stopping).
    """
    while True:
        try:
            ev = await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                raise _Abandoned() from None
            continue
        if ev.kind == "done":
            return ev.result
        if ev.kind == "error":
            raise _as_api_error(ev.error)
        if ev.kind == "shutdown":
            raise _Abandoned(_as_api_error(ev.error))
        if ev.kind == "cancelled":
            raise _Abandoned(shutting_down("the request was cancelled: the server is stopping; retry"), last=ev)


def _as_api_error(e: BaseException | None) -> APIError:
    if isinstance(e, APIError):
        return e
    return APIError(500, f"generation failed ({type(e).__name__}); see the server log", type="server_error")


async def _stream(state: ServingState, job: Job, req: GenerationRequest, rid: str, endpoint: str, t0: float) -> AsyncIterator[bytes]:
    """Server-sent events: text deltas, then a last chunk with ``finish_reason``, ``usage`` and
    ``tss``, then ``data: [DONE]``. Cancels the job when the client goes away."""
    name = state.model_name
    first = True
    ended = False  # the worker's last event was read
    try:
        if req.kind == "chat":  # OpenAI's first chat chunk carries the role
            yield sse(chunk_body(req, rid, name, "", first=True))
            first = False
        while True:
            ev: Event = await job.events.get()
            if ev.kind == "delta":
                yield sse(chunk_body(req, rid, name, ev.text, first=first))
                first = False
                continue
            ended = ev.kind != "shutdown"
            if ev.kind == "done":
                res = ev.result
                reason, usage, tss = _finish(job, res)
                state.observe_service(usage.completion_tokens, tss.tokens_per_s)
                state.metrics.served(endpoint, res.domain, usage.completion_tokens, tss.accept_length, time.perf_counter() - t0)
                yield sse(chunk_body(req, rid, name, job.tracker.release(final=True), finish_reason=reason, usage=usage, tss=tss))
                yield sse("[DONE]")
                return
            # An error, the shutdown's cut, or a cancellation the client did not ask for
            # (the worker stopping): the stream still ends with an error event and [DONE].
            if ev.kind == "cancelled":
                state.abandon(job, endpoint, ev)
                e = shutting_down("the request was cancelled: the server is stopping; retry")
            else:
                e = _as_api_error(ev.error)
            state.metrics.errors.labels(status=str(e.status)).inc()
            yield sse(e.body())
            yield sse("[DONE]")
            return
    finally:
        state.jobs.pop(id(job), None)
        if not ended:  # the client left mid-stream, or the shutdown cut it: stop the decoding
            state.abandon(job, endpoint)
