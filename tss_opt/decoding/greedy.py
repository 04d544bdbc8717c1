"""Greedy generations of many (prompt, skip set) rows at once: the batch engine at depth 0.

The replay evaluator needs, per trial, only the sparse target's greedy continuation of every
prompt (and, for EAGLE, the target's features of the committed tokens). Plain decoding is the
batch engine with no drafter: every row commits the target's next token per step, and the
rows of a step share one ragged forward (:func:`~tss_opt.decoding.ragged.ragged_forward`), a
layer running on the tokens of the rows that do not skip it only. So the replay runs the
target through the same model runner as the server and the batch engine, with the same
per-row skip mechanism (:meth:`~tss_opt.decoding.skip.SkipController.apply_ragged`), and a
row's tokens are those of the request decoded alone (tests/decoding/test_batch.py).

:class:`GreedySource` is the seam: anything that returns :class:`Generation` rows for
(prompts x skip sets) can feed the replay (another engine, e.g. vLLM serving per-request skip
sets), and the replay itself (:func:`~tss_opt.evaluation.replay.replay_stats`) stays one copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from tss_opt.decoding.batch import BatchEngine, Row
from tss_opt.decoding.prefill import DensePrefill
from tss_opt.decoding.target import TargetModel

__all__ = ["BatchGreedy", "Generation", "GreedySource"]


@dataclass
class Generation:
    """One row's greedy output.

    Attributes:
        tokens: generated token ids (the prefill's first token included), ending at the first
            stop token if one came.
        prefill_logits: ``(1, vocab)``: the target's logits at the last prompt position, or
            ``None`` when features were not asked for.
        features: ``(P + len(tokens) - 1, hidden)``: the decoder's final hidden states at the
            prompt and at every generated token that was fed back (all but the last), or
            ``None`` when not asked for.
    """

    tokens: list[int]
    prefill_logits: torch.Tensor | None
    features: torch.Tensor | None


class GreedySource(Protocol):
    """Greedy generations for every (skip set, prompt) pair: what the replay evaluator runs on."""

    def __call__(
        self,
        prompts: Sequence[torch.Tensor],
        skips: Sequence[frozenset[int]],
        *,
        max_new_tokens: int,
        scope: str,
        eos_token_ids: Iterable[int],
        keep_hidden: bool,
        prefills: Sequence[DensePrefill] | None,
    ) -> list[list[Generation]]:
        """``result[g][b]``: prompt ``b``'s greedy output under ``skips[g]``.

        Args:
            prompts: ``torch.LongTensor`` of shape ``(P_b,)`` each.
            scope: ``"verify"`` (dense prefill, sparse decoding) or ``"all"`` (sparse throughout).
            keep_hidden: fill :attr:`Generation.features` and ``prefill_logits`` (EAGLE).
            prefills: one dense prefill per prompt to start from (``"verify"`` only), or
                ``None``: the source prefills itself.
        """
        ...


class BatchGreedy:
    """:class:`GreedySource` on the project's batch engine: every (skip set, prompt) pair is a
    row of one :class:`~tss_opt.decoding.batch.BatchEngine` without a drafter.

    In ``verify`` scope with ``prefills`` given, a row starts from a copy of its prompt's
    dense prefill (no prompt forward); otherwise the rows' prompts run together in the first
    step (each under its own skip set in ``all`` scope).
    """

    def __init__(self, target: TargetModel) -> None:
        self.target = target

    def __call__(
        self,
        prompts: Sequence[torch.Tensor],
        skips: Sequence[frozenset[int]],
        *,
        max_new_tokens: int,
        scope: str = "verify",
        eos_token_ids: Iterable[int] = (),
        keep_hidden: bool = False,
        prefills: Sequence[DensePrefill] | None = None,
    ) -> list[list[Generation]]:
        if prefills is not None and len(prefills) != len(prompts):
            raise ValueError(f"got {len(prefills)} prefills for {len(prompts)} prompts; pass one per prompt or None")
        eos = tuple(int(t) for t in eos_token_ids)
        engine = BatchEngine(self.target)  # no depth policy: no drafter, nothing to draft
        groups = [
            [
                engine.admit(
                    prompt, max_new_tokens=max_new_tokens, skip=skip, scope=scope, eos_token_ids=eos,
                    prefill=None if prefills is None else prefills[b], record_features=keep_hidden,
                )
                for b, prompt in enumerate(prompts)
            ]
            for skip in skips
        ]
        engine.run()
        return [[_generation(row) for row in rows] for rows in groups]


def _generation(row: Row) -> Generation:
    """A finished row as a :class:`Generation` (features cut to the tokens fed back)."""
    tokens = row.tokens.tolist()
    features = None
    if row.features is not None:
        features = torch.cat(row.features, dim=0)[: int(row.prompt.numel()) + len(tokens) - 1]
    return Generation(tokens=tokens, prefill_logits=row.prefill_logits, features=features)
