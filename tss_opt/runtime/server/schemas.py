"""OpenAI response bodies (completions, chat completions, stream chunks) and the ``tss`` object.

Requests are parsed and validated by the pydantic models of ``request_models.py`` (re-exported
here: :class:`GenerationRequest`, :func:`parse_json`, :func:`parse_request`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tss_opt.config.objectives import ACCEPT_LENGTH
from tss_opt.runtime.server.request_models import GenerationRequest, Kind, parse_json, parse_request

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
            ACCEPT_LENGTH: round(self.accept_length, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            # This request's verification steps and the decoder-layer forwards they ran on
            # its tokens: layers minus its skip set per step (the compute the skip set saved).
            "steps": self.steps,
            "layer_forwards": self.layer_forwards,
        }


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

