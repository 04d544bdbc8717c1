"""Speculative decoding with a skippable target (batch size 1).

The loop, in the stages of the data flow: ``prefill`` the prompt, then repeat ``draft``
(the drafter proposes a tree below the last committed token), ``verify`` (one target forward
over the whole tree), ``accept`` (longest matching path plus the target's bonus token) and
roll the cache back to the accepted path. Chains are one-branch trees: one verification path.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from tss_opt.config.enums import Scope
from tss_opt.evaluation.decoding.accept import accept_greedy, accept_sampling, sample_token
from tss_opt.evaluation.decoding.cache import keep_accepted
from tss_opt.evaluation.decoding.drafter import Drafter, VerifyFeedback
from tss_opt.evaluation.decoding.prefill import DensePrefill
from tss_opt.evaluation.decoding.stats import DecodeStats
from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.decoding.tree import DraftTree

SkipScope = Literal["verify", "all"]
SCOPES: tuple[str, ...] = tuple(s.value for s in Scope)


class NoDrafter(Drafter):
    """Proposes nothing: every step commits exactly the target's next token (plain decoding)."""

    def propose(self, context: torch.Tensor) -> DraftTree:
        return DraftTree.empty()


@dataclass
class GenerationResult:
    """Output of one request.

    Attributes:
        tokens: ``torch.LongTensor`` of shape ``(new_tokens,)``: the generated tokens only.
        stats: the request's :class:`DecodeStats`.
    """

    tokens: torch.Tensor
    stats: DecodeStats


class SpeculativeEngine:
    """Generates with a drafter and a target that may bypass a skip set.

    Args:
        target: the verifier.
        drafter: proposes candidates; ``None`` means plain (drafting-free) decoding.
        eos_token_ids: generation stops after any of these.
    """

    def __init__(self, target: TargetModel, drafter: Drafter | None = None, eos_token_ids: Iterable[int] = ()) -> None:
        self.target = target
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.eos = frozenset(int(t) for t in eos_token_ids)

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: torch.Tensor | Sequence[int],
        *,
        max_new_tokens: int,
        skip: Iterable[int] = (),
        scope: SkipScope = "verify",
        temperature: float = 0.0,
        seed: int | None = None,
        prefill: DensePrefill | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.
            skip: target layers bypassed; kept for the whole request.
            scope: ``"verify"`` skips only in verification forwards after a dense prefill (the
                paper's setting); ``"all"`` skips in every target forward, prefill included.
            temperature: 0 = greedy verification (lossless: equals greedy decoding of the same
                target); > 0 = speculative sampling (keeps the target's distribution).
            seed: seeds the sampling generator (temperature > 0).
            prefill: this prompt's dense prefill computed earlier (``prefill.dense_prefill``);
                the request starts from a copy of it instead of running the prompt (scope
                ``"verify"`` only; same tokens, ``stats.prefill_layer_forwards`` = 0).
        """
        if scope not in SCOPES:
            raise ValueError(f"scope={scope!r} is not a skip scope; expected one of {', '.join(SCOPES)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}; expected a positive integer")
        target, drafter = self.target, self.drafter
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).cpu()
        P = int(prompt.numel())
        if P == 0:
            raise ValueError("the prompt is empty; give at least one token")
        target.check_fits(P, max_new_tokens)
        skip_set = frozenset(int(i) for i in skip)
        gen = torch.Generator().manual_seed(seed) if (temperature > 0 and seed is not None) else None
        stats = DecodeStats(prompt_tokens=P, num_layers=target.num_layers, skipped_layers=len(skip_set))

        # seq holds prompt + committed tokens; drafters see a prefix view of it.
        seq = torch.empty(P + max_new_tokens, dtype=torch.long)
        seq[:P] = prompt
        n_out = 0
        t_start = time.perf_counter()
        drafter.reset(prompt)

        # --- prefill -------------------------------------------------------------------
        ctr = target.skipper
        if prefill is not None:  # reused dense prefill (prefill.py): no prompt forward
            cache, logits, hidden = prefill.restore(prompt, scope)
        else:
            cache = target.new_cache()
            with target.skip(skip_set if scope == "all" else ()):
                before = ctr.executed_layers
                logits, hidden = target.prefill(prompt, cache)
                stats.prefill_layer_forwards = ctr.executed_layers - before
        first = sample_token(logits[-1], temperature, gen)
        if drafter.needs_prefill_feedback:
            drafter.prefill_feedback(prompt, logits, hidden)
        stats.prefill_s = time.perf_counter() - t_start
        seq[P] = first
        n_out = 1
        prefix_len = P  # tokens whose keys/values are cached in layers that run
        done = first in self.eos

        # --- draft / verify / accept ------------------------------------------------------
        with target.skip(skip_set):
            while not done and n_out < max_new_tokens:
                context = seq[: P + n_out]
                root = int(context[-1])
                t0 = time.perf_counter()
                tree = drafter.propose(context)
                t1 = time.perf_counter()
                before = ctr.executed_layers
                logits, hidden = target.verify_forward(root, tree, cache, prefix_len)
                stats.verify_layer_forwards += ctr.executed_layers - before
                if temperature > 0:
                    accepted, committed = accept_sampling(tree, logits, temperature, gen)
                else:
                    accepted, committed = accept_greedy(tree, logits)
                keep_accepted(cache, prefix_len, len(tree) + 1, [0, *(i + 1 for i in accepted)])
                prefix_len += 1 + len(accepted)
                t2 = time.perf_counter()

                # commit, truncated at EOS and at the token budget
                kept = 0
                for tok in committed:
                    if n_out >= max_new_tokens:
                        break
                    seq[P + n_out] = tok
                    n_out += 1
                    kept += 1
                    if tok in self.eos:
                        done = True
                        break
                stats.steps += 1
                stats.step_tokens += kept
                stats.draft_proposed += len(tree)
                stats.draft_accepted += min(len(accepted), kept)
                drafter.update(
                    VerifyFeedback(
                        tree=tree,
                        accepted=tuple(accepted),
                        committed=torch.tensor(committed, dtype=torch.long),
                        logits=logits,
                        hidden=hidden,
                        root_token=root,
                    )
                )
                t3 = time.perf_counter()
                stats.draft_s += (t1 - t0) + (t3 - t2)
                stats.verify_s += t2 - t1

        stats.new_tokens = n_out
        stats.total_s = time.perf_counter() - t_start
        return GenerationResult(tokens=seq[P : P + n_out].clone(), stats=stats)
