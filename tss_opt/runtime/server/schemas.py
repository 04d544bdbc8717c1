"""OpenAI request parsing and response bodies (completions, chat completions, stream chunks).

Requests are parsed by hand from the decoded JSON rather than by pydantic so that every
refusal names the field in OpenAI's error shape. Fields OpenAI defines that do not change
what greedy decoding here produces (``user``, ``top_p`` = 1, ``n`` = 1, penalties of 0...) are
accepted; ones that would (``n`` > 1, ``logprobs``) are refused; unknown fields are ignored,
as OpenAI-compatible servers do, so that newer clients keep working.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tss_opt.runtime.server.errors import bad_request

__all__ = [
    "GenerationRequest",
    "TSSInfo",
    "Usage",
    "chunk_body",
    "models_body",
    "new_id",
    "parse_json",
    "parse_request",
    "response_body",
    "sse",
]

Kind = Literal["completion", "chat"]
ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_STOP = 4  # OpenAI's limit on stop sequences


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request.

    Attributes:
        kind: ``"completion"`` (raw text continued as given) or ``"chat"`` (chat template).
        model: The model the request names.
        prompt: Completions: text or token ids.
        messages: Chat: ``{"role", "content"}`` dicts.
        max_tokens: Tokens to generate (``None``: the server's ``max_new_tokens``).
        temperature: ``None``: the server's ``temperature`` (0 = greedy).
        seed: Seeds sampling.
        stop: Strings that end the output (not included in it).
        stream: Answer as server-sent events.
        include_usage: ``stream_options.include_usage``.
        domain: The request's domain label (``None``: the router decides).
    """

    kind: Kind
    model: str | None
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    domain: str | None = None

    @property
    def prompt_param(self) -> str:
        """The field that holds the prompt (what errors about its length name)."""
        return "messages" if self.kind == "chat" else "prompt"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True)
class TSSInfo:
    """The ``tss`` object every response carries (the last chunk of a stream); docs/serving.md."""

    domain: str | None
    skip_set: list[int] = field(default_factory=list)
    routed: bool = False
    accept_length: float = 1.0
    tokens_per_s: float = 0.0
    steps: int = 0
    layer_forwards: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "skip_set": list(self.skip_set),
            "routed": self.routed,
            "accept_length": round(self.accept_length, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            # This request's verification steps and the decoder-layer forwards they ran on
            # its tokens: layers minus its skip set per step (the compute the skip set saved).
            "steps": self.steps,
            "layer_forwards": self.layer_forwards,
        }


# --------------------------------------------------------------------------------- parsing
def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON ({e}); send a JSON object", code="invalid_json") from e
    if not isinstance(body, dict):
        raise bad_request(f"the request body is a JSON {type(body).__name__}; send a JSON object", code="invalid_json")
    return body


def _typed(body: Mapping[str, Any], name: str, types: tuple[type, ...], expected: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python; JSON true is not a number.
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise bad_request(f"{name}={json.dumps(value)[:80]} has the wrong type; expected {expected}", param=name, code="invalid_type")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("stop has the wrong type; expected a string or a list of strings", param="stop", code="invalid_type")
    if len(stop) > MAX_STOP:
        raise bad_request(f"stop has {len(stop)} sequences; give at most {MAX_STOP}", param="stop")
    if any(s == "" for s in stop):
        raise bad_request("stop contains an empty string; remove it", param="stop")
    return tuple(stop)


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if msgs is None:
        raise bad_request("messages is required: a list of {role, content} objects", param="messages", code="missing_field")
    if not isinstance(msgs, list):
        raise bad_request("messages has the wrong type; expected a list of {role, content} objects", param="messages", code="invalid_type")
    if not msgs:
        raise bad_request("messages is empty; give at least one message", param="messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} is not an object; expected {{role, content}}", param=where, code="invalid_type")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise bad_request(f"{where}.role={json.dumps(role)}; expected one of {', '.join(ROLES)}", param=f"{where}.role")
        if isinstance(content, list):  # OpenAI's content parts: only text parts can be served
            parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
                raise bad_request(f"{where}.content has non-text parts; this model reads text only", param=f"{where}.content")
            content = "".join(parts)  # type: ignore[arg-type]
        if not isinstance(content, str):
            raise bad_request(f"{where}.content has the wrong type; expected a string", param=f"{where}.content", code="invalid_type")
        out.append({"role": str(role), "content": content})
    if not any(m["content"].strip() for m in out):
        raise bad_request("every message is empty; give some text", param="messages")
    return out


def _prompt(body: Mapping[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("prompt is required: a string (or a list of token ids)", param="prompt", code="missing_field")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt is empty; give some text", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"prompt is a batch of {len(prompt)} prompts; send one prompt per request", param="prompt")
    raise bad_request("prompt has the wrong type; expected a non-empty string or list of token ids", param="prompt", code="invalid_type")


def parse_request(body: Mapping[str, Any], kind: Kind) -> GenerationRequest:
    """Validate an OpenAI completions (``kind="completion"``) or chat completions body.

    Raises:
        APIError: 400 naming the field at fault.
    """
    model = _typed(body, "model", (str,), "a string (GET /v1/models lists it)")
    if kind == "chat":
        messages, prompt = _messages(body), None
    else:
        messages, prompt = None, _prompt(body)
    max_tokens = _typed(body, "max_tokens", (int,), "an integer >= 1")
    if kind == "chat" and max_tokens is None:
        max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer >= 1")
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens={max_tokens}; expected an integer >= 1", param="max_tokens")
    temperature = _typed(body, "temperature", (int, float), "a number >= 0")
    if temperature is not None and not 0 <= temperature <= 2:
        raise bad_request(f"temperature={temperature}; expected a number in [0, 2] (0 = greedy)", param="temperature")
    seed = _typed(body, "seed", (int,), "an integer")
    stream = _typed(body, "stream", (bool,), "true or false")
    opts = _typed(body, "stream_options", (dict,), "an object such as {\"include_usage\": true}") or {}
    include_usage = opts.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request("stream_options.include_usage has the wrong type; expected true or false", param="stream_options.include_usage", code="invalid_type")
    domain = _typed(body, "domain", (str,), "a domain name such as \"qa\" (or omit it: the router decides)")
    if domain is not None and not domain.strip():
        domain = None
    n = _typed(body, "n", (int,), "an integer")
    if n is not None and n != 1:
        raise bad_request(f"n={n}; this server returns one choice per request (n=1)", param="n")
    top_p = _typed(body, "top_p", (int, float), "a number in (0, 1]")
    if top_p is not None and top_p != 1:
        raise bad_request(f"top_p={top_p}; only top_p=1 is supported (the engine samples the full distribution)", param="top_p")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported by this server; omit logprobs", param="logprobs")
    _typed(body, "user", (str,), "a string")
    return GenerationRequest(
        kind=kind, model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature), seed=seed, stop=_stop(body),
        stream=bool(stream), include_usage=include_usage, domain=domain.strip() if domain else None,
    )


# --------------------------------------------------------------------------------- responses
def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def response_body(
    req: GenerationRequest, rid: str, model: str, text: str, finish_reason: str, usage: Usage, tss: TSSInfo
) -> dict[str, Any]:
    """The non-streamed answer."""
    if req.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
        "usage": usage.to_dict(), "tss": tss.to_dict(),
    }


def chunk_body(
    req: GenerationRequest,
    rid: str,
    model: str,
    text: str,
    *,
    first: bool = False,
    finish_reason: str | None = None,
    usage: Usage | None = None,
    tss: TSSInfo | None = None,
) -> dict[str, Any]:
    """One server-sent event's data: a text delta; the last one carries ``finish_reason``,
    ``usage`` and ``tss``."""
    if req.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if usage is not None:
        out["usage"] = usage.to_dict()
    if tss is not None:
        out["tss"] = tss.to_dict()
    return out


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def models_body(names: Sequence[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "tss_opt"} for n in names]}

