"""Chat requests: messages through the model's chat template, a domain's system prompt first.

The search formats each prompt as one user turn, after the domain's ``system_prompt`` as a
system turn (:func:`~tss_opt.evaluation.domains.format_prompt`); a chat request gets the same
system turn when it brings none, so a one-message request is formatted exactly as the
search's prompts were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["chat_ids", "has_system", "is_chat"]


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
        # Without a template: format_prompt's plain-text layout (system, blank line, turns).
        text = "\n\n".join(m["content"] for m in msgs)
        return torch.as_tensor(tokenizer(text)["input_ids"], dtype=torch.long).reshape(-1)
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    return torch.as_tensor(ids, dtype=torch.long).reshape(-1)
