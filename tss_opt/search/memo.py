"""Share measurements between the studies of one comparison run.

``compare`` and ``sweep`` run several searches with the same evaluator on the same prompts;
most of them start with the same level (every single layer) and the greedy evaluator is
deterministic, so measuring a skip set twice spends CPU time and yields the same accepted
length and metric. :class:`MemoEvaluator` answers a repeated ``(skip set, prompt_ids)``
request from memory. Each study still records the trial (its budget counts it, as it would
have been measured), so evaluations and generated tokens per strategy are unchanged; only the
wall time falls. ``tokens_per_s`` of a repeated request is the first measurement's.

Only deterministic evaluators should be memoized (greedy decoding: ``temperature == 0``);
:func:`memoizable` says whether an evaluator is.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any


class MemoEvaluator:
    """An evaluator wrapper that measures each ``(skip set, prompt_ids)`` once.

    Args:
        inner: the evaluator (the search's contract: ``inner(skip)`` or
            ``inner(skip, prompt_ids=[...])`` returning a mapping). Every other attribute
            (``num_layers``, ``num_prompts``, ``metric_name``...) is read from it.

    Attributes:
        hits: requests answered from memory.
        misses: requests measured by ``inner``.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.hits = 0
        self.misses = 0
        self._done: dict[tuple[frozenset[int], tuple[int, ...] | None], Mapping[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes this wrapper lacks: the evaluator's own (num_prompts...).
        if name == "inner":  # not yet set (copy/pickle): avoid recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, skip: frozenset[int], prompt_ids: Sequence[int] | None = None) -> Mapping[str, Any]:
        key = (frozenset(int(i) for i in skip), None if prompt_ids is None else tuple(int(i) for i in prompt_ids))
        if key in self._done:
            self.hits += 1
        else:
            self.misses += 1
            self._done[key] = self.inner(key[0]) if prompt_ids is None else self.inner(key[0], prompt_ids=key[1])
        # A copy: the search may annotate what it gets back.
        return copy.deepcopy(self._done[key])

    def call_group(
        self, skips: Sequence[frozenset[int]], prompt_ids: Sequence[int] | None = None
    ) -> list[Mapping[str, Any]]:
        """Grouped requests (``inner.call_group``, when ``inner.supports_groups``): the sets
        not measured yet are measured together, the others answered from memory."""
        ids = None if prompt_ids is None else tuple(int(i) for i in prompt_ids)
        keys = [(frozenset(int(i) for i in s), ids) for s in skips]
        missing = list(dict.fromkeys(k for k in keys if k not in self._done))
        if missing:
            answers = self.inner.call_group([k[0] for k in missing], prompt_ids=None if ids is None else list(ids))
            self._done.update(zip(missing, answers, strict=True))
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        return [copy.deepcopy(self._done[k]) for k in keys]


def memoizable(evaluator: Any) -> bool:
    """Whether ``evaluator`` gives the same answer for the same request (greedy decoding).

    An evaluator that states ``temperature`` is memoizable when it is 0; one that does not
    state it is assumed deterministic only if it says so with ``deterministic = True``.
    """
    temperature = getattr(evaluator, "temperature", None)
    if temperature is not None:
        return float(temperature) == 0.0
    return bool(getattr(evaluator, "deterministic", False))
