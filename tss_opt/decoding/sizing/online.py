"""A copy chain's length chosen at every step from the acceptance its request has shown so far.

A sized chain (:mod:`~tss_opt.decoding.sizing.context`) is a function of the context length:
one acceptance profile, measured on a few calibration prompts, decides for every request. A
copy drafter's acceptance varies far more between requests than with the length (on the
2026-12-05 EPYC, prompt lookup accepted 3.7 tokens a step on 64-token summarization prompts and
its first token at 0.37 on the calibration prompts), so where verifying a draft costs 1.4x a
plain step the static choice is "never" for every request or "always" for every request.

What a copy drafter proposed is scored at no cost to the target: under greedy decoding, a
chain proposed after position ``t`` would have had exactly the prefix accepted that equals
the tokens the target commits after ``t``. :class:`OnlineChain` keeps every proposal of the
request at its full length (speculated or not: a drafter that is not speculating keeps
learning) and, as the target commits tokens, counts per depth ``d``:

* ``reached[d]``: proposals whose first ``d - 1`` tokens matched and whose ``d``-th is known;
* ``hits[d]``: those whose ``d``-th token matched too.

The conditional acceptance at depth ``d`` is the posterior mean with the calibrated profile as
the prior, worth ``strength`` proposals: ``(hits[d] + s * prior_d) / (reached[d] + s)``. A step
that has a proposal takes the length ``k`` maximising::

    rate(k) = (1 + sum_{j <= k} prod_{i <= j} p_i) / latency(k)

(``k = 0``: a plain step) from the latency table of the step's context bucket, and speculates
only when that beats plain decoding by :data:`~tss_opt.decoding.sizing.choice.SPECULATION_MARGIN`.
Unlike the static choice, it needs no proposal rate: the step knows whether it has a proposal.
Everything is a function of the request's prompt and committed tokens, so replaying a greedy
output reproduces it (``evaluator=replay``). With sampling (temperature > 0) the committed
tokens are samples and the scores estimate acceptance under that sampling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tss_opt.decoding.sizing.choice import SPECULATION_MARGIN, AcceptanceProfile
from tss_opt.decoding.sizing.context import CONTEXT_BUCKETS, context_bucket, fitting_buckets
from tss_opt.decoding.sizing.latency import LatencyTable, TreeSizingError, load_or_measure_latency

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = ["OnlineChain"]


class OnlineChain:
    """Per-step chain lengths for a copy drafter, from its own request's acceptance.

    Args:
        tables: verification latency per context bucket (cached tokens -> table); a step
            uses the smallest bucket that holds its context (the largest beyond it).
        prior: the calibrated acceptance (its rank-0 column by depth), or the drafter's prior.
        max_tokens: the longest chain proposed and scored.
        strength: how many proposals the prior is worth.
        margin: the gain over a plain step a chain must promise.

    Attributes:
        reached, hits: the request's counts per depth (index ``d - 1``), as in the module docstring.
        chosen: the length chosen at each step that had a proposal (for tests and reports).
    """

    def __init__(
        self, tables: Mapping[int, LatencyTable], prior: AcceptanceProfile, *, max_tokens: int,
        strength: float = 2.0, margin: float = SPECULATION_MARGIN,
    ) -> None:
        if not tables:
            raise TreeSizingError("an online chain needs at least one latency table (a context bucket)")
        if max_tokens < 1 or strength <= 0:
            raise TreeSizingError(
                f"an online chain needs max_tokens >= 1 and strength > 0; got max_tokens={max_tokens}, strength={strength}"
            )
        self.tables = dict(sorted(tables.items()))
        self.max_tokens = max_tokens
        self.strength = strength
        self.margin = margin
        self.prior = [prior.p(d, 0) for d in range(1, max_tokens + 1)]
        self.prior_name = prior.name
        # The latency of every length, per bucket: a step reads a list instead of interpolating.
        self._seconds = {b: [t.at(k) for k in range(max_tokens + 1)] for b, t in self.tables.items()}
        self.reset()

    @classmethod
    def for_target(
        cls, target: TargetModel, prior: AcceptanceProfile, *, max_tokens: int, strength: float = 2.0,
        directory: str | Path | None = None, buckets: tuple[int, ...] = CONTEXT_BUCKETS,
    ) -> OnlineChain:
        """The target's latency tables (cached, else measured now, as every sized drafter's)."""
        tables = {b: load_or_measure_latency(target, directory, prefix_len=b) for b in fitting_buckets(target, buckets)}
        return cls(tables, prior, max_tokens=max_tokens, strength=strength)

    def reset(self) -> None:
        """Start a request: nothing scored, nothing pending."""
        self.reached = [0] * self.max_tokens
        self.hits = [0] * self.max_tokens
        self.chosen: list[int] = []
        # (position of its first token, its tokens, tokens compared so far)
        self._pending: list[tuple[int, list[int], int]] = []
        self._seen = 0  # context length at the last call

    def accept(self) -> list[float]:
        """The posterior conditional acceptance by depth (index ``d - 1``)."""
        s = self.strength
        return [(h + s * p) / (n + s) for h, n, p in zip(self.hits, self.reached, self.prior)]

    def _score(self, context: torch.Tensor) -> None:
        """Compare the pending proposals with the tokens committed since the last call."""
        L = int(context.numel())
        if L < self._seen:  # not an extension of the last context: a new request without reset
            self.reset()
        self._seen = L
        if not self._pending:
            return
        first = min(start + done for start, _, done in self._pending)
        if first >= L:
            return
        new = context[first:L].tolist()  # the committed tokens no pending proposal has seen
        kept = []
        for start, tokens, done in self._pending:
            while done < len(tokens) and start + done < L:
                d = done  # depth d + 1
                self.reached[d] += 1
                if tokens[d] != new[start + d - first]:
                    done = -1
                    break
                self.hits[d] += 1
                done += 1
            if 0 <= done < len(tokens):
                kept.append((start, tokens, done))
        self._pending = kept

    def length(self, context: torch.Tensor, proposal: torch.Tensor | Sequence[int]) -> int:
        """Score what was committed since the last call, keep ``proposal`` for scoring, and
        return how many of its tokens to speculate on (``0``: a plain step).

        Args:
            context: ``torch.LongTensor`` of shape ``(L,)``: the prompt and committed tokens.
            proposal: ``torch.LongTensor`` of shape ``(K,)``, or a list of ``K`` token ids (a
                drafter that holds one need not make a tensor to be read back), ``K <=
                max_tokens`` kept: the drafter's full proposal continuing ``context`` (empty:
                nothing to propose).
        """
        self._score(context)
        tokens = proposal.tolist() if isinstance(proposal, torch.Tensor) else list(proposal)
        K = min(len(tokens), self.max_tokens)
        if K == 0:
            return 0
        L = int(context.numel())
        self._pending.append((L, tokens[:K], 0))
        seconds = self._seconds[context_bucket(self.tables, L)]
        best_k, best_rate = 0, 1.0 / seconds[0]
        plain = best_rate
        expected, path = 1.0, 1.0
        for k, p in enumerate(self.accept()[:K], start=1):
            path *= p
            expected += path
            rate = expected / seconds[k]
            if rate > best_rate * (1 + 1e-12):
                best_k, best_rate = k, rate
        if best_k and best_rate < plain * (1 + self.margin):
            best_k = 0
        self.chosen.append(best_k)
        return best_k

    def describe(self) -> str:
        p = ", ".join(f"{x:.2f}" for x in self.accept()[:4])
        return (f"online chain up to {self.max_tokens} (prior {self.prior_name}, strength {self.strength:g}; "
                f"acceptance by depth now {p}, ...)")
