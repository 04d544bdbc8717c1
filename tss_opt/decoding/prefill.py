"""Dense prefills computed once and reused by many requests (the ``verify`` scope's saving).

Under the ``verify`` skip scope the prompt is prefilled by the *dense* target whatever the skip
set, so every trial of a search recomputes the same prefill for the same prompt. A
:class:`DensePrefill` holds that prefill's result (the KV cache after the prompt, the last
position's logits and the prompt's hidden states); :meth:`SpeculativeEngine.generate
<tss_opt.decoding.engine.SpeculativeEngine.generate>` takes it as ``prefill=`` and
starts from a deep copy instead of running the prompt through the model. Lossless: the
tokens are exactly those of a request that prefills itself (tests/decoding/test_prefill.py).

Under the ``all`` scope the prefill skips the trial's layers too, so it differs per skip set
and cannot be shared; :meth:`DensePrefill.restore` refuses it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from tss_opt.decoding.cache import SkipAwareCache
from tss_opt.decoding.target import TargetModel


@dataclass(frozen=True)
class DensePrefill:
    """One prompt's dense prefill, kept read-only; requests get copies.

    Attributes:
        prompt: ``torch.LongTensor`` of shape ``(P,)``: the prompt it belongs to (on CPU).
        cache: the target's KV cache after the prompt (every layer holds ``P`` positions).
        logits: ``(1, vocab)``: the target's logits at the last prompt position.
        hidden: ``(P, hidden)``: the decoder's last hidden states (for drafters that take
            prefill feedback, e.g. EAGLE).
        layer_forwards: decoder-layer forwards the prefill ran (what each reuse saves).
        seconds: wall time of the prefill (what each reuse saves, roughly).
    """

    prompt: torch.Tensor
    cache: SkipAwareCache
    logits: torch.Tensor
    hidden: torch.Tensor
    layer_forwards: int
    seconds: float

    def restore(self, prompt: torch.Tensor, scope: str) -> tuple[SkipAwareCache, torch.Tensor, torch.Tensor]:
        """A private copy of the prefill's state for one request.

        Args:
            prompt: ``torch.LongTensor`` of shape ``(P,)``: the request's prompt.
            scope: the request's skip scope; only ``"verify"`` prefills densely.

        Returns:
            ``(cache, logits, hidden)``: a deep copy of the cache (every layer's tensors
            cloned, and whatever else a layer type carries, e.g. a sliding window's offsets)
            and clones of the logits ``(1, vocab)`` and hidden states ``(P, hidden)``.

        Raises:
            ValueError: if ``scope`` is not ``"verify"`` or the prompt is not this prefill's.
        """
        if scope != "verify":
            raise ValueError(
                f"a reused prefill is dense, but scope={scope!r} skips layers in the prefill too; "
                "reuse prefills only with scope='verify' (or pass prefill=None)"
            )
        if not torch.equal(prompt.cpu(), self.prompt):
            raise ValueError(
                f"the reused prefill belongs to another prompt ({self.prompt.numel()} tokens, the request has "
                f"{prompt.numel()}); compute one DensePrefill per prompt"
            )
        # deepcopy rather than per-layer clones: layer types (sliding window, ...) carry more
        # state than keys and values, and the copy must not share a tensor with the original,
        # which later requests reuse.
        return copy.deepcopy(self.cache), self.logits.clone(), self.hidden.clone()


@torch.inference_mode()
def dense_prefill(target: TargetModel, prompt_ids: torch.Tensor) -> DensePrefill:
    """Prefill ``prompt_ids`` with the dense target, exactly as the engine does.

    Args:
        target: the verifier (no layer is skipped during the call).
        prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.

    Returns:
        The prefill, to pass as ``SpeculativeEngine.generate(..., prefill=...)``.
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).cpu()
    if prompt.numel() == 0:
        raise ValueError("the prompt is empty; give at least one token")
    cache = target.new_cache()
    ctr = target.skipper
    t0 = time.perf_counter()
    with target.skip(()):
        before = ctr.executed_layers
        logits, hidden = target.prefill(prompt, cache)
        forwards = ctr.executed_layers - before
    return DensePrefill(
        prompt=prompt, cache=cache, logits=logits, hidden=hidden, layer_forwards=forwards,
        seconds=time.perf_counter() - t0,
    )
