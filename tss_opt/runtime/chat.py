"""Chat requests: messages through the model's chat template, a domain's system prompt first.

The search formats each prompt as one user turn, after the domain's ``system_prompt`` as a
system turn (:func:`~tss_opt.evaluation.domains.format_prompt`); a chat request gets the same
system turn when it brings none, so a one-message request is formatted exactly as the
search's prompts were.

Message content is text: a special-token string written in a message
(``<|im_end|>\n<|im_start|>system``...) is tokenized as the characters it is made of, never as
the control token, so a user cannot close their turn and write a system turn. Only the
template's own markers are control tokens. Content without such strings takes the plain
``apply_chat_template`` path (ids identical to the search's); content with them is
rendered with placeholders and each piece tokenized on its own (:func:`_text_safe_ids`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["chat_ids", "control_strings", "has_system", "is_chat"]


def is_chat(prompt: object) -> bool:
    """Whether a prompt is a list of chat messages (dicts), not text or token ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(m, Mapping) for m in prompt)


def has_system(messages: Sequence[Mapping[str, str]]) -> bool:
    return any(m.get("role") == "system" for m in messages)


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], system_prompt: str | None = None) -> torch.Tensor:
    """Chat messages through the model's chat template, with the generation prompt.

    ``system_prompt`` goes first as a system message when the messages have none: for one
    user message this is exactly :func:`~tss_opt.evaluation.domains.format_prompt`'s ids (how
    the search formatted its prompts).

    Returns:
        ``torch.LongTensor`` of shape ``(P,)``.
    """
    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    if system_prompt and not has_system(msgs):
        msgs.insert(0, {"role": "system", "content": system_prompt})
    if not getattr(tokenizer, "chat_template", None):
        # Without a template: format_prompt's plain-text layout (system, blank line, turns),
        # all of it content.
        text = "\n\n".join(m["content"] for m in msgs)
        return torch.as_tensor(tokenizer(text, split_special_tokens=True)["input_ids"], dtype=torch.long).reshape(-1)
    controls = control_strings(tokenizer)
    if any(c in m["content"] for m in msgs for c in controls):
        return torch.as_tensor(_text_safe_ids(tokenizer, msgs), dtype=torch.long).reshape(-1)
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    return torch.as_tensor(ids, dtype=torch.long).reshape(-1)


def control_strings(tokenizer: Any) -> tuple[str, ...]:
    """The strings the tokenizer reads as special tokens (``<|im_start|>``, ``<|endoftext|>``...)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    specials = {str(t) for t in decoder.values() if getattr(t, "special", False)}
    specials |= {str(t) for t in getattr(tokenizer, "all_special_tokens", ())}
    return tuple(sorted(s for s in specials if s))


def _text_safe_ids(tokenizer: Any, msgs: list[dict[str, str]]) -> list[int]:
    """The template's ids with every message's content tokenized as text.

    The template is rendered with a placeholder in place of each content; the template's
    pieces are tokenized as usual (their markers become control tokens), each content with
    ``split_special_tokens=True`` (its special-token strings stay characters).

    Raises:
        ValueError: The template changes message content (trims it, say), so the pieces
            cannot be put back in place; the request is refused rather than risk reading
            content as control tokens.
    """
    tag = uuid.uuid4().hex
    holders = [f"TSSCONTENT{tag}N{i}E" for i in range(len(msgs))]
    rendered = tokenizer.apply_chat_template(
        [{**m, "content": h} for m, h in zip(msgs, holders)], add_generation_prompt=True, tokenize=False
    )
    real = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    pieces = re.split(f"(TSSCONTENT{tag}N\\d+E)", rendered)
    by_holder = {h: m["content"] for h, m in zip(holders, msgs)}
    if "".join(by_holder.get(p, p) for p in pieces) != real:
        raise ValueError(
            "the chat template changes message content, so content holding special-token strings cannot be "
            "formatted safely; remove the special-token strings from the messages"
        )
    ids: list[int] = []
    for p in pieces:
        if not p:
            continue
        content = by_holder.get(p)
        text, split = (p, False) if content is None else (content, True)
        if text:
            ids.extend(tokenizer(text, add_special_tokens=False, split_special_tokens=split)["input_ids"])
    return ids
