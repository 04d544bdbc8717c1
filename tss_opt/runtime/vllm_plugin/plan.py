"""The per-step skip plan: which tokens of a vLLM batch run which decoder layers.

vLLM lays a step's tokens out row after row (``query_start_loc``), every row a request at its
own positions: a prompt chunk, one decode token, or a token and its speculative drafts. The rule
is per token and per layer, and depends on the token's position only:

    token t of row r skips layer l  iff  l in S_r  and  (scope_r == "all"  or  pos_t >= prompt_len_r)

Being positional, it gives the same answer in a chunked prefill, in the recomputation after a
preemption and in the verification of speculative drafts as in plain decoding, so each request
sees exactly the computation of its own sparse target. Per layer the plan is one of three kinds
(:class:`LayerKind`): every token skips it (the layer is not run), none does (it runs as in
plain vLLM), or some do (``mixed``: the layer runs attention on every token, since all layers
share one attention metadata, and its MLP on the kept tokens only; see ``model.py``).

Torch and numpy only, no vLLM: the tests build plans directly.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["LayerCounts", "LayerKind", "RowSpan", "StepPlan", "build_plan", "current_plan", "stepping"]


class LayerKind(enum.IntEnum):
    dense = 0
    skip = 1
    mixed = 2


@dataclass(frozen=True)
class RowSpan:
    """One row of a step: its tokens ``[start, end)`` in the flattened batch and its request.

    Attributes:
        start, end: The row's token range in the step's ``input_ids``.
        skip_set: Its request's skipped layers (empty: dense).
        scope: ``verify`` or ``all``.
        prompt_len: Its request's prompt length (tokens at positions below it are prompt).
    """

    start: int
    end: int
    skip_set: tuple[int, ...]
    scope: str
    prompt_len: int


@dataclass
class StepPlan:
    """What each layer does in one step.

    Attributes:
        kinds: Per layer, a :class:`LayerKind`.
        kept: Per mixed layer, the indices (``torch.LongTensor`` of shape ``(n_kept,)``, on the
            step's device) of the tokens that run its MLP; layers with the same pattern share
            one tensor.
        skipped_tokens: Per layer, how many real tokens skip it this step.
    """

    kinds: list[LayerKind]
    kept: dict[int, torch.Tensor] = field(default_factory=dict)
    skipped_tokens: list[int] = field(default_factory=list)

    def kind(self, layer: int) -> LayerKind:
        return self.kinds[layer]


def build_plan(
    rows: Sequence[RowSpan], positions: np.ndarray, num_tokens: int, num_layers: int, device: torch.device | str
) -> StepPlan | None:
    """The plan of one step, or ``None`` when no token skips anything (plain vLLM's step).

    Args:
        rows: The step's rows in batch order.
        positions: ``int64`` array of shape ``(n_real,)``, each real token's position.
        num_tokens: Tokens the model runs (``>= n_real``: padding tokens follow the real ones;
            their outputs are discarded, so each layer lets them follow its real tokens).
        num_layers: The model's decoder layer count.
        device: Where the kept-token indices go.
    """
    if all(not r.skip_set for r in rows):
        return None
    n_real = rows[-1].end if rows else 0
    # skips[l, t]: token t skips layer l.
    skips = np.zeros((num_layers, n_real), dtype=bool)
    for r in rows:
        if not r.skip_set or r.end <= r.start:
            continue
        if r.scope == "all":
            tokens = np.arange(r.start, r.end)
        else:
            tokens = r.start + np.flatnonzero(positions[r.start:r.end] >= r.prompt_len)
        if tokens.size:
            skips[np.ix_(np.asarray(r.skip_set), tokens)] = True
    counts = skips.sum(axis=1)
    if not counts.any():
        return None
    kinds: list[LayerKind] = []
    kept: dict[int, torch.Tensor] = {}
    shared: dict[bytes, torch.Tensor] = {}
    for layer in range(num_layers):
        n = int(counts[layer])
        if n == 0:
            kinds.append(LayerKind.dense)
        elif n == n_real:
            kinds.append(LayerKind.skip)
        else:
            kinds.append(LayerKind.mixed)
            key = np.packbits(skips[layer]).tobytes()
            if key not in shared:
                keep = np.flatnonzero(~skips[layer])
                if num_tokens > n_real:  # padding runs with the kept tokens (don't-care outputs)
                    keep = np.concatenate([keep, np.arange(n_real, num_tokens)])
                shared[key] = torch.from_numpy(keep).to(device=device, dtype=torch.long)
            kept[layer] = shared[key]
    return StepPlan(kinds=kinds, kept=kept, skipped_tokens=[int(c) for c in counts])


@dataclass
class LayerCounts:
    """Per layer, how many steps ran it dense, skipped it, or ran it mixed, and how many
    token-layer MLP forwards the skip sets saved (the saving the plugin reports)."""

    num_layers: int
    steps: int = 0
    dense: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    mixed: list[int] = field(default_factory=list)
    tokens_skipped: list[int] = field(default_factory=list)
    tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("dense", "skipped", "mixed", "tokens_skipped"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_layers)

    def add(self, plan: StepPlan | None, n_real: int) -> None:
        self.steps += 1
        self.tokens += n_real
        for layer in range(self.num_layers):
            kind = LayerKind.dense if plan is None else plan.kinds[layer]
            (self.dense, self.skipped, self.mixed)[kind][layer] += 1
            if plan is not None:
                self.tokens_skipped[layer] += plan.skipped_tokens[layer]

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps, "tokens": self.tokens, "dense": self.dense, "skipped": self.skipped,
            "mixed": self.mixed, "tokens_skipped": self.tokens_skipped,
        }


# The plan of the step being run in this process (``None``: every layer dense). The runner hook
# sets it around the model's forward; the decoder layers read it.
_PLAN: StepPlan | None = None


def current_plan() -> StepPlan | None:
    return _PLAN


@contextmanager
def stepping(plan: StepPlan | None) -> Iterator[None]:
    """Make ``plan`` the plan of the forward run inside; restored after, also on an error."""
    global _PLAN
    before, _PLAN = _PLAN, plan
    try:
        yield
    finally:
        _PLAN = before
