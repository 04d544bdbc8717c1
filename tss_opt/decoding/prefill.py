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

The evaluators keep their prefills in a :class:`PrefillStore`: a byte budget
(``prefill_store_gib``, default :data:`DEFAULT_PREFILL_STORE_GIB`) with least-recently-used
eviction, released before validation runs its own prompts (unbounded, the stores
held ~21 GiB for 16 + 16 summarization prompts of a 13B model in fp16).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from tss_opt.decoding.cache import SkipAwareCache
from tss_opt.decoding.target import TargetModel

log = logging.getLogger(__name__)

# The default budget, for a 7B model on a 24 GB card with the CPU preset's 16 calibration
# prompts (docs/engine.md, "Bounded prefill store", has the arithmetic): a Llama-2-7B KV cache
# costs 2 (K, V) x 32 layers x 4096 x 2 bytes (fp16) = 512 KiB per token; a summarization
# prompt has ~865 Llama tokens (the 0.66 GiB per prompt on 13B at 800 KiB/token), so
# ~0.43 GiB per prompt and ~6.8 GiB for 16. 8 GiB holds them; 12.6 GiB of weights + 8 GiB
# leaves ~1.7 GiB of a 22.35 GiB card for the running request's cache and activations.
DEFAULT_PREFILL_STORE_GIB = 8.0
GIB = 1 << 30


def _tensors_nbytes(obj: Any) -> int:
    """Bytes held by the tensors of a prefill: the cache's layers' keys and values, and any
    tensor attribute (logits, hidden states)."""
    total = 0
    cache = getattr(obj, "cache", None)
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    for name in ("logits", "hidden"):
        t = getattr(obj, name, None)
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PrefillStore(Generic[K, V]):
    """Prefills by key (a prompt index, a batch of indices) under a byte budget.

    :meth:`get` computes a missing prefill and keeps it, evicting the least recently used
    ones until the total fits ``budget_bytes``; a prefill larger than the whole budget is
    returned without being kept (the request still runs, from its own prefill).

    Args:
        budget_bytes: the most bytes of kept tensors (>= 0; 0 keeps nothing).
        nbytes: the size of a value; default counts its cache's keys/values, logits, hidden.
    """

    def __init__(self, budget_bytes: int, nbytes: Callable[[V], int] = _tensors_nbytes) -> None:
        if budget_bytes < 0:
            raise ValueError(f"prefill store budget={budget_bytes} bytes; expected >= 0 (prefill_store_gib >= 0)")
        self.budget_bytes = int(budget_bytes)
        self._nbytes = nbytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.nbytes = 0  # bytes kept now
        self.peak_bytes = 0
        self.evictions = 0
        self.hits = 0
        self.misses = 0

    @classmethod
    def from_gib(cls, gib: float | None) -> PrefillStore[Any, Any]:
        """A store of ``gib`` GiB (``None``: :data:`DEFAULT_PREFILL_STORE_GIB`)."""
        gib = DEFAULT_PREFILL_STORE_GIB if gib is None else float(gib)
        if gib < 0:
            raise ValueError(f"prefill_store_gib={gib}; expected a size in GiB >= 0 (0 keeps no prefill)")
        return cls(int(gib * GIB))

    def get(self, key: K, compute: Callable[[], V]) -> V:
        """The prefill of ``key``, computed with ``compute()`` on a miss."""
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key][0]
        self.misses += 1
        value = compute()
        size = self._nbytes(value)
        if size > self.budget_bytes:
            if self.budget_bytes > 0:
                log.warning(
                    "a prefill of %.2f GiB exceeds prefill_store_gib=%.2f: it is not kept (raise the budget to reuse it)",
                    size / GIB, self.budget_bytes / GIB,
                )
            return value
        while self._items and self.nbytes + size > self.budget_bytes:
            _, (_, old) = self._items.popitem(last=False)  # least recently used first
            self.nbytes -= old
            self.evictions += 1
        self._items[key] = (value, size)
        self.nbytes += size
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        return value

    def clear(self) -> None:
        """Drop every kept prefill (their memory returns to the allocator)."""
        self._items.clear()
        self.nbytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


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
