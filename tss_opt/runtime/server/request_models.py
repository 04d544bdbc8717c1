"""OpenAI request bodies as pydantic models: every field validated at parse time.

The models say what each field may hold (types strict: JSON ``true`` is not a number, ``"10"``
is not an integer; integers bounded); a refusal is built from the validation error, so
OpenAI's ``param`` is the error's location (``max_tokens``, ``messages[0].content``) and the
message names the value, what was expected and the fix. Unknown fields are ignored, as
OpenAI-compatible servers do, so that newer clients keep working.

Fields that would change the output and that this engine does not implement are refused with
a 400 naming them unless they hold their neutral value: the speculative verifier
compares the target's own distribution, so ``frequency_penalty``, ``presence_penalty`` and
``logit_bias`` cannot be honoured without giving up lossless output; ``response_format``,
``tools`` / ``tool_choice``, ``logprobs``, ``n``, ``top_p``, and on completions ``echo``,
``best_of`` and ``suffix`` are not implemented. Fields that do not change the output
(``user``, ``model``...) are accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from tss_opt.runtime.server.errors import APIError, bad_request

__all__ = [
    "SEED_MAX",
    "SEED_MIN",
    "ChatRequest",
    "CompletionRequest",
    "GenerationRequest",
    "param_of",
    "parse_json",
    "parse_request",
]

Kind = Literal["completion", "chat"]
Role = Literal["system", "user", "assistant", "tool", "developer"]
MAX_STOP = 4  # OpenAI's limit on stop sequences
# What ``torch.Generator.manual_seed`` accepts (it reads the seed as a signed or unsigned
# 64-bit integer); 2**64 overflows there, after the request took a queue slot.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
INT64_MAX = 2**63 - 1

# What each field holds, for messages about it (keyed by the location, list indices as []).
EXPECTED = {
    "model": "a string (GET /v1/models lists it)",
    "prompt": "a non-empty string or list of token ids",
    "messages": "a list of {role, content} objects",
    "messages[]": "a {role, content} object",
    "messages[].role": "one of system, user, assistant, tool, developer",
    "messages[].content": "a string (or a list of text parts)",
    "max_tokens": "an integer >= 1",
    "max_completion_tokens": "an integer >= 1",
    "temperature": "a number in [0, 2] (0 = greedy)",
    "top_p": "1",
    "n": "1",
    "seed": f"an integer in [{SEED_MIN}, {SEED_MAX}]",
    "stop": f"a string or a list of up to {MAX_STOP} non-empty strings",
    "stream": "true or false",
    "stream_options": 'an object such as {"include_usage": true}',
    "stream_options.include_usage": "true or false",
    "domain": 'a domain name such as "qa" (or omit it: the router decides)',
    "user": "a string",
    "frequency_penalty": "0 (penalties are not supported)",
    "presence_penalty": "0 (penalties are not supported)",
    "logit_bias": "an empty object (logit_bias is not supported)",
    "response_format": '{"type": "text"}',
    "echo": "false",
    "best_of": "1",
    "suffix": "a string (only an empty one is supported)",
    "top_logprobs": "0",
    "modalities": '["text"]',
}

# pydantic error types that mean "the wrong JSON type" (OpenAI-style code ``invalid_type``).
_TYPE_ERRORS = {"invalid_type", "model_type", "model_attributes_type", "dict_type", "list_type", "is_instance_of"}


def _unsupported(name: str, value: Any, why: str) -> PydanticCustomError:
    """A refusal of a field this server does not implement (``why`` says the fix)."""
    return PydanticCustomError("unsupported", "{message}", {"message": f"{name}={_show(value)} is not supported: {why}"})


def _invalid(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{message}", {"message": message})


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class Message(_Strict):
    """One chat message; OpenAI's content parts are joined when all of them are text."""

    role: Role
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in v):
                raise _invalid("unsupported", "content has non-text parts; this model reads text only: send text parts or a string")
            return "".join(p["text"] for p in v)
        return v


class _Common(_Strict):
    """The fields both endpoints share."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(allow_inf_nan=False)] | None = None
    n: int | None = None
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stop: list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    domain: str | None = None
    user: str | None = None
    frequency_penalty: Annotated[float, Field(allow_inf_nan=False)] | None = None
    presence_penalty: Annotated[float, Field(allow_inf_nan=False)] | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: Any = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if len(v) > MAX_STOP:
            raise _invalid("value_error", f"stop has {len(v)} sequences; give at most {MAX_STOP}")
        if any(s == "" for s in v):
            raise _invalid("value_error", "stop contains an empty string; remove it")
        return v

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str | None) -> str | None:
        return v.strip() or None if v is not None else None

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise _unsupported("n", v, "this server returns one choice per request; use n=1 and send several requests")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float | None) -> float | None:
        if v not in (None, 1):
            raise _unsupported("top_p", v, "only top_p=1 is supported (the engine samples the full distribution); omit it")
        return v

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _penalty(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v not in (None, 0):
            raise _unsupported(
                str(info.field_name), v,
                "the speculative verifier checks drafts against the target's own distribution, and penalties would "
                f"change it; omit {info.field_name} (or send 0)",
            )
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise _unsupported(
                "logit_bias", v,
                "the speculative verifier checks drafts against the target's own distribution, and a bias would change "
                "it; omit logit_bias (or send {})",
            )
        return v

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v != {"type": "text"}:
            raise _unsupported("response_format", v, 'structured output is not implemented; omit it (or send {"type": "text"})')
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: Any) -> Any:
        if v not in (None, False, 0):
            raise _unsupported("logprobs", v, "this server returns no log probabilities; omit logprobs")
        return v


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is text or token ids, continued as given.

    Validated with ``context={"vocab_size": V}``, every token id is below ``V``.
    """

    prompt: str | list[int]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]  # a batch of one
        if isinstance(v, str):
            if not v:
                raise _invalid("value_error", "prompt is empty; give some text")
            return v
        if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            # Checked here, not in torch.as_tensor: 10**20 overflowed there as a 500.
            vocab = (info.context or {}).get("vocab_size")
            bad = next((t for t in v if not 0 <= t < (vocab or INT64_MAX)), None)
            if bad is not None:
                ids = f"the model's ids are 0-{vocab - 1}" if vocab else "token ids are integers >= 0 below the vocabulary size"
                raise _invalid("value_error", f"prompt has token id {bad}; {ids}")
            return v
        if isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
            raise _invalid("value_error", f"prompt is a batch of {len(v)} prompts; send one prompt per request")
        raise _invalid("invalid_type", f"prompt={_show(v)} has the wrong type; expected {EXPECTED['prompt']}")

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool | None) -> bool | None:
        if v:
            raise _unsupported("echo", v, "the answer never repeats the prompt here; omit echo")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise _unsupported("best_of", v, "this server generates one candidate per request; omit best_of")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise _unsupported("suffix", v, "insertion (fill-in-the-middle) is not implemented; omit suffix")
        return v


class ChatRequest(_Common):
    """``POST /v1/chat/completions``: ``messages`` through the model's chat template."""

    messages: list[Message]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    top_logprobs: int | None = None
    # tool_choice is declared before tools: the tools check reads it.
    tool_choice: Any = None
    tools: list[dict[str, Any]] | None = None
    function_call: Any = None
    functions: list[dict[str, Any]] | None = None
    modalities: list[str] | None = None
    audio: Any = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[Message]) -> list[Message]:
        if not v:
            raise _invalid("value_error", "messages is empty; give at least one message")
        if not any(m.content.strip() for m in v):
            raise _invalid("value_error", "every message is empty; give some text")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None) -> int | None:
        if v not in (None, 0):
            raise _unsupported("top_logprobs", v, "this server returns no log probabilities; omit top_logprobs")
        return v

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _tool_choice(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None or v in ("none", "auto"):
            return v
        if isinstance(v, (str, dict)):
            raise _unsupported(str(info.field_name), v, 'tool calls are not implemented; omit it (or send "none")')
        raise _invalid("invalid_type", f'{info.field_name}={_show(v)} has the wrong type; expected "none" or "auto"')

    @field_validator("tools", "functions")
    @classmethod
    def _tools(cls, v: list[dict[str, Any]] | None, info: ValidationInfo) -> list[dict[str, Any]] | None:
        choice = info.data.get("tool_choice" if info.field_name == "tools" else "function_call")
        if v and choice != "none":
            raise _unsupported(
                str(info.field_name), v,
                "tool calls are not implemented (the model would answer without seeing them); omit "
                f"{info.field_name}, or send {'tool_choice' if info.field_name == 'tools' else 'function_call'}=\"none\"",
            )
        return v

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and v != ["text"]:
            raise _unsupported("modalities", v, 'this model answers in text only; omit modalities (or send ["text"])')
        return v

    @field_validator("audio")
    @classmethod
    def _audio(cls, v: Any) -> Any:
        if v is not None:
            raise _unsupported("audio", v, "this model answers in text only; omit audio")
        return v


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request, as the routes use it.

    Attributes:
        kind: ``"completion"`` (raw text continued as given) or ``"chat"`` (chat template).
        model: The model the request names.
        prompt: Completions: text or token ids.
        messages: Chat: ``{"role", "content"}`` dicts.
        max_tokens: Tokens to generate (``None``: the server's ``max_new_tokens``).
        temperature: ``None``: the server's ``temperature`` (0 = greedy).
        seed: Seeds sampling (within ``[SEED_MIN, SEED_MAX]``).
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


# --------------------------------------------------------------------------------- parsing
def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, and a 5,000-digit number
        raise bad_request(f"the request body is not valid JSON ({e}); send a JSON object", code="invalid_json") from e
    except RecursionError as e:
        raise bad_request("the request body nests too deeply to parse; send a flat JSON object", code="invalid_json") from e
    if not isinstance(body, dict):
        raise bad_request(f"the request body is a JSON {type(body).__name__}; send a JSON object", code="invalid_json")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def param_of(loc: Sequence[int | str]) -> str | None:
    """OpenAI's ``param`` from a validation error's location: ``("messages", 0, "content")``
    -> ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int) or part == "[]":
            out += f"[{part}]" if isinstance(part, int) else part
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _as_api_error(err: Mapping[str, Any]) -> APIError:
    """One pydantic error as OpenAI's 400."""
    loc = tuple(err.get("loc", ()))
    param = param_of(loc)
    kind = str(err.get("type", ""))
    key = param_of(["[]" if isinstance(p, int) else p for p in loc]) or ""
    expected = EXPECTED.get(key)
    if kind == "missing":
        return bad_request(f"{param} is required: {expected or 'give it'}", param=param, code="missing_field")
    custom = (err.get("ctx") or {}).get("message")
    is_type = kind in _TYPE_ERRORS or kind.endswith("_type")
    if custom:
        # A nested model's message names its own field ("content ..."): name it in full.
        message = str(custom)
        last = loc[-1] if loc else None
        if isinstance(last, str) and param and param != last and message.startswith(last + " "):
            message = param + message[len(last):]
    elif is_type:
        message = f"{param}={_show(err.get('input'))} has the wrong type; expected {expected or err.get('msg')}"
    else:
        message = f"{param}={_show(err.get('input'))}; expected {expected or err.get('msg')}"
    return bad_request(message, param=param, code="invalid_type" if is_type else None)


def parse_request(body: Mapping[str, Any], kind: Kind, vocab_size: int | None = None) -> GenerationRequest:
    """Validate an OpenAI completions (``kind="completion"``) or chat completions body.

    Args:
        body: The decoded JSON object.
        kind: The endpoint's kind.
        vocab_size: The model's vocabulary: token ids of a completions prompt must be below it.

    Raises:
        APIError: 400 naming the field at fault (the first error found).
    """
    model_cls = ChatRequest if kind == "chat" else CompletionRequest
    try:
        r = model_cls.model_validate(body, context={"vocab_size": vocab_size})
    except ValidationError as e:
        raise _as_api_error(e.errors(include_url=False)[0]) from None
    max_tokens = r.max_tokens
    if isinstance(r, ChatRequest):
        if max_tokens is None:
            max_tokens = r.max_completion_tokens
        messages: list[dict[str, str]] | None = [{"role": m.role, "content": m.content} for m in r.messages]
        prompt = None
    else:
        messages, prompt = None, r.prompt
    return GenerationRequest(
        kind=kind, model=r.model, prompt=prompt, messages=messages, max_tokens=max_tokens,
        temperature=r.temperature, seed=r.seed, stop=tuple(r.stop or ()), stream=bool(r.stream),
        include_usage=bool(r.stream_options and r.stream_options.include_usage), domain=r.domain,
    )
