"""Independent greedy references (no engine code): what the engine must reproduce exactly."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tss_opt.decoding.cache import SkipAwareCache, with_cache
from tss_opt.decoding.skip import SkipController


@torch.inference_mode()
def greedy_no_cache(model, prompt: torch.Tensor, n: int, skip: Iterable[int] = ()) -> list[int]:
    """Scope "all": every forward recomputes the whole sequence with ``skip`` bypassed."""
    seq = prompt.clone()
    with SkipController.for_model(model).apply(skip):
        for _ in range(n):
            logits = model(input_ids=seq[None], use_cache=False).logits[0, -1]
            seq = torch.cat([seq, logits.argmax().reshape(1)])
    return seq[len(prompt) :].tolist()


@torch.inference_mode()
def greedy_dense_prefill(model, prompt: torch.Tensor, n: int, skip: Iterable[int] = ()) -> list[int]:
    """Scope "verify": a dense prefill, then one-token cached steps with ``skip`` bypassed."""
    cache = SkipAwareCache(config=model.config)
    logits = model(input_ids=prompt[None], **with_cache(cache), use_cache=True).logits[0, -1]
    out = [int(logits.argmax())]
    with SkipController.for_model(model).apply(skip):
        for _ in range(n - 1):
            pos = torch.tensor([[len(prompt) + len(out) - 1]])
            logits = model(input_ids=torch.tensor([[out[-1]]]), position_ids=pos, **with_cache(cache), use_cache=True).logits[0, -1]
            out.append(int(logits.argmax()))
    return out
