"""Speculative decoding with a skippable target (batch size 1).

The loop, in the stages of the data flow, one method each: ``prefill`` the prompt, then
repeat ``draft`` (the drafter proposes a tree below the last committed token), ``verify``
(one target forward over the whole tree), ``accept`` (longest matching path plus the target's
bonus token; the cache is rolled back to it) and ``commit`` (append, stop at EOS, let the
drafter learn). Chains are one-branch trees: one verification path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from tss_opt.config.enums import Scope
from tss_opt.decoding.budget import draft_depth_limit, prune_depth
from tss_opt.decoding.cache import keep_accepted, preallocate, request_capacity
from tss_opt.decoding.drafter import Drafter, NoDrafter, VerifyFeedback
from tss_opt.decoding.prefill import DensePrefill
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.decoding.verify.accept import (
    PositionalSampler,
    accept_coupled,
    accept_greedy,
    accept_sampling,
)
from tss_opt.decoding.verify.relaxed import Verifier

SkipScope = Literal["verify", "all"]
SCOPES: tuple[str, ...] = tuple(s.value for s in Scope)
# Called with the tokens a step committed (``torch.LongTensor`` of shape ``(k,)``); returning
# True stops the request after that step (a server's cancel or stop-string check).
StepHook = Callable[[torch.Tensor], "bool | None"]


@dataclass
class GenerationResult:
    """Output of one request.

    Attributes:
        tokens: ``torch.LongTensor`` of shape ``(new_tokens,)``: the generated tokens only.
        stats: the request's :class:`DecodeStats`.
    """

    tokens: torch.Tensor
    stats: DecodeStats


@dataclass
class _Request:
    """The state of one request while it decodes (what the named steps share).

    Attributes:
        prompt: ``torch.LongTensor`` of shape ``(P,)``.
        seq: ``torch.LongTensor`` of shape ``(P + max_new_tokens,)``: prompt, then committed
            tokens (``seq[: P + n_out]`` is the context the drafter sees).
        n_out: tokens committed so far.
        cache: the target's KV cache; ``prefix_len`` tokens are cached in layers that run.
        sampler: draws the target's tokens when ``temperature > 0`` (deterministic drafts).
        generator: the stream of speculative sampling for stochastic drafts (``q`` given).
    """

    prompt: torch.Tensor
    seq: torch.Tensor
    max_new_tokens: int
    stats: DecodeStats
    cache: Any
    prefix_len: int
    temperature: float
    sampler: PositionalSampler | None
    generator: torch.Generator | None
    n_out: int = 0
    done: bool = False
    last: int = -1  # the newest committed token, kept as an int (no tensor read per step)
    started_at: float = 0.0  # perf_counter() when the request started

    @property
    def context(self) -> torch.Tensor:
        """``torch.LongTensor`` of shape ``(P + n_out,)``: prompt and committed tokens."""
        return self.seq[: len(self.prompt) + self.n_out]


def checked_request(target: TargetModel, prompt_ids: torch.Tensor | Sequence[int], max_new_tokens: int, scope: str) -> torch.Tensor:
    """A request's prompt as ``torch.LongTensor`` of shape ``(P,)`` on the host, after the
    checks every way of decoding makes (one request alone, or a row of a batch).

    Raises:
        ValueError: an unknown scope, ``max_new_tokens`` < 1 or an empty prompt.
        ContextLengthError: the prompt and ``max_new_tokens`` exceed the model's context.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not a skip scope; expected one of {', '.join(SCOPES)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}; expected a positive integer")
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).cpu()
    if prompt.numel() == 0:
        raise ValueError("the prompt is empty; give at least one token")
    target.check_fits(int(prompt.numel()), max_new_tokens)
    return prompt


class SpeculativeEngine:
    """Generates with a drafter and a target that may bypass a skip set.

    :meth:`generate` runs the stages of the data flow as named steps: :meth:`prefill`, then
    per step :meth:`draft`, :meth:`verify`, :meth:`accept` and :meth:`commit`.

    Args:
        target: the verifier.
        drafter: proposes candidates; ``None`` means plain (drafting-free) decoding.
        eos_token_ids: generation stops after any of these.
        verification: the acceptance rule: ``"exact"`` (default, lossless), ``"diversed"`` or
            ``"cospec"`` (lossy; verification.py), or a :class:`Verifier` with its weight or
            policy. A relaxed mode needs a drafter that gives a distribution (else
            :class:`~tss_opt.decoding.verify.relaxed.RelaxedVerificationError`).
    """

    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter | None = None,
        eos_token_ids: Iterable[int] = (),
        verification: Verifier | str = "exact",
    ) -> None:
        self.target = target
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.verifier = verification if isinstance(verification, Verifier) else Verifier(mode=verification)  # type: ignore[arg-type]
        if drafter is not None:  # plain decoding drafts nothing: any rule is exact there
            self.verifier.prepare(self.drafter)

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
        on_step: StepHook | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.
            skip: target layers bypassed; kept for the whole request.
            scope: ``"verify"`` skips only in verification forwards after a dense prefill (the
                paper's setting); ``"all"`` skips in every target forward, prefill included.
            temperature: 0 = greedy verification (lossless: equals greedy decoding of the same
                target); > 0 = sampling that keeps the target's distribution. With a seed the
                output is reproducible: for deterministic drafters it equals plain sampling
                with that seed token for token (:func:`accept_coupled`).
            seed: seeds the request's sampling (temperature > 0); ``None``: a random seed.
            prefill: this prompt's dense prefill computed earlier (``prefill.dense_prefill``);
                the request starts from a copy of it instead of running the prompt (scope
                ``"verify"`` only; same tokens, ``stats.prefill_layer_forwards`` = 0).
            on_step: called after the prefill and after every step with the tokens that step
                committed (``torch.LongTensor`` of shape ``(k,)``, ``k >= 0``); when it returns
                True the request ends there. It only observes: the tokens committed until then
                are those of a run without it (streaming, cancellation, stop strings).
        """
        prompt = checked_request(self.target, prompt_ids, max_new_tokens, scope)
        skip_set = frozenset(int(i) for i in skip)
        t_start = time.perf_counter()
        req = self.prefill(prompt, max_new_tokens, skip_set, scope, temperature, seed, prefill)
        P = len(req.prompt)
        if on_step is not None and on_step(req.seq[P : P + req.n_out].clone()):
            req.done = True
        with self.target.skip(skip_set):
            while not req.done and req.n_out < req.max_new_tokens:
                before_step = req.n_out
                t0 = time.perf_counter()
                tree = self.draft(req)
                t1 = time.perf_counter()
                logits, hidden = self.verify(req, tree)
                accepted, committed = self.accept(req, tree, logits)
                t2 = time.perf_counter()
                self.commit(req, tree, accepted, committed, logits, hidden)
                t3 = time.perf_counter()
                req.stats.draft_s += (t1 - t0) + (t3 - t2)
                req.stats.verify_s += t2 - t1
                if on_step is not None and on_step(req.seq[P + before_step : P + req.n_out].clone()):
                    break
        req.stats.new_tokens = req.n_out
        req.stats.total_s = time.perf_counter() - t_start
        return GenerationResult(tokens=req.seq[P : P + req.n_out].clone(), stats=req.stats)

    # ------------------------------------------------------------------------ the steps
    def prefill(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        skip_set: frozenset[int],
        scope: str,
        temperature: float,
        seed: int | None,
        reused: DensePrefill | None = None,
    ) -> _Request:
        """Run (or restore) the prompt's forward, commit the first token, reset the drafter.

        Args:
            prompt: ``torch.LongTensor`` of shape ``(P,)``.
        """
        req = self.start(prompt, max_new_tokens, skip_set, temperature, seed)
        target = self.target
        # The cache appends in place into buffers sized to the request (cache.py's
        # InPlaceLayer): transformers' layers concatenate, copying every cached token at every
        # step (a plain float32 step of SmolLM2 after 770 cached tokens 1.03x faster, the same
        # bits: docs/engine.md "Eager step").
        capacity = request_capacity(int(prompt.numel()), max_new_tokens)
        if reused is not None:  # reused dense prefill (prefill.py): no prompt forward
            cache, logits, hidden = reused.restore(prompt, scope)
            preallocate(cache, capacity)  # the stored prefill stays compact; its copy grows in place
        else:
            cache = target.new_cache(capacity=capacity)
            ctr = target.skipper
            with target.skip(skip_set if scope == "all" else ()):
                before = ctr.executed_layers
                logits, hidden = target.prefill(prompt, cache)
                req.stats.prefill_layer_forwards = ctr.executed_layers - before
        self.first_token(req, cache, logits, hidden)
        return req

    def start(
        self, prompt: torch.Tensor, max_new_tokens: int, skip_set: frozenset[int], temperature: float, seed: int | None
    ) -> _Request:
        """A request's state before its prompt's forward: statistics, output buffer, the
        drafter and the rule reset, the sampling streams (the batch engine runs the forward
        itself, with other rows, then calls :meth:`first_token`).

        Args:
            prompt: ``torch.LongTensor`` of shape ``(P,)``.
        """
        P = int(prompt.numel())
        stats = DecodeStats(
            prompt_tokens=P,
            num_layers=self.target.num_layers,
            skipped_layers=len(skip_set),
            verification=self.verifier.describe(),
        )
        self.verifier.begin_request()
        seq = torch.empty(P + max_new_tokens, dtype=torch.long)
        seq[:P] = prompt
        self.drafter.reset(prompt)
        sampler = PositionalSampler(temperature, seed) if temperature > 0 else None
        # Speculative sampling of stochastic drafts: its own stream, derived from the seed, on
        # the model's device (torch.multinomial and torch.rand need the generator on the device
        # of the probabilities; on the CPU this is the same stream as before).
        generator = (
            torch.Generator(device=self.target.device).manual_seed(sampler.seed) if sampler is not None else None
        )
        return _Request(
            prompt=prompt,
            seq=seq,
            max_new_tokens=max_new_tokens,
            stats=stats,
            cache=None,
            prefix_len=P,
            temperature=temperature,
            sampler=sampler,
            generator=generator,
            n_out=0,
            started_at=time.perf_counter(),
        )

    def first_token(self, req: _Request, cache: Any, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Commit the prompt forward's token and let the drafter see the prompt's states.

        Args:
            cache: the KV cache the prompt's forward filled.
            logits: ``(>= 1, vocab)``; the last row is the prompt's last position.
            hidden: ``(P, hidden)``: the prompt's final hidden states.
        """
        req.cache = cache
        sampler = req.sampler
        first = sampler.draw(logits[-1], 0) if sampler is not None else int(logits[-1].argmax())
        if self.drafter.capabilities.prefill_feedback:
            self.drafter.prefill_feedback(req.prompt, logits, hidden)
        req.stats.prefill_s = time.perf_counter() - req.started_at
        req.seq[req.prefix_len] = first
        req.n_out = 1
        req.done = first in self.eos
        req.last = first

    def draft(self, req: _Request, cap: int | None = None) -> DraftTree:
        """The drafter's proposal below the last committed token, within budget: no node
        deeper than the tokens left to generate or the context's positions allow (budget.py;
        the draft slots are counted, so a request that fits the context stays inside it),
        nor than ``cap`` (the batch's per-step depth, ``decoding/batch_budget.py``)."""
        limit = draft_depth_limit(req.prefix_len, req.max_new_tokens - req.n_out, self.target.max_context)
        if cap is not None:
            limit = min(limit, cap)
        # prune_depth is a no-op for a drafter that honours the limit itself.
        return prune_depth(self.drafter.propose_within(req.context, limit), limit)

    def verify(self, req: _Request, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """One target forward over the root and the tree (under the request's skip set).

        Returns:
            ``logits`` of shape ``(n + 1, vocab)`` and ``hidden`` of shape ``(n + 1, hidden)``:
            rows ``[root, node_0, ...]``.
        """
        ctr = self.target.skipper
        before = ctr.executed_layers
        root = req.last
        logits, hidden = self.target.verify_forward(root, tree, req.cache, req.prefix_len)
        req.stats.verify_layer_forwards += ctr.executed_layers - before
        return logits, hidden

    def accept(self, req: _Request, tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], list[int]]:
        """Which nodes the target keeps and what it commits; rolls the cache back to them.

        Greedy: the argmax path. Temperature > 0: the coupled rule for deterministic drafts
        (the output equals plain sampling with the seed), speculative sampling for chains
        drafted from a distribution. A relaxed :class:`Verifier` (DIVERSED, CoSpec) decides
        instead and counts the tokens only it accepted in ``stats.relaxed_accepted``.
        """
        if self.verifier.lossy and len(tree):
            accepted, committed, relaxed = self.verifier.accept(
                tree, logits, temperature=req.temperature, sampler=req.sampler, generator=req.generator,
                position=req.n_out,
            )
            req.stats.relaxed_accepted += relaxed
        elif req.sampler is None:
            accepted, committed = accept_greedy(tree, logits)
        elif tree.sampled_probs is None:
            accepted, committed = accept_coupled(tree, logits, req.sampler, req.n_out)
        else:
            accepted, committed = accept_sampling(tree, logits, req.temperature, req.generator)
        # Keep the root's and the accepted nodes' keys/values; drop the rest of the tree.
        keep_accepted(req.cache, req.prefix_len, len(tree) + 1, [0, *(i + 1 for i in accepted)])
        req.prefix_len += 1 + len(accepted)
        return accepted, committed

    def commit(
        self,
        req: _Request,
        tree: DraftTree,
        accepted: list[int],
        committed: list[int],
        logits: torch.Tensor,
        hidden: torch.Tensor,
    ) -> None:
        """Append the committed tokens (truncated at EOS and the budget), count the step and
        let the drafter learn from the verification."""
        P, kept = len(req.prompt), 0
        root = req.last
        for tok in committed:
            if req.n_out >= req.max_new_tokens:
                break
            req.seq[P + req.n_out] = tok
            req.last = tok
            req.n_out += 1
            kept += 1
            if tok in self.eos:
                req.done = True
                break
        stats = req.stats
        stats.steps += 1
        stats.step_tokens += kept
        stats.draft_proposed += len(tree)
        stats.draft_accepted += min(len(accepted), kept)
        self.drafter.update(
            VerifyFeedback(
                tree=tree,
                accepted=tuple(accepted),
                committed=torch.tensor(committed, dtype=torch.long),
                logits=logits,
                hidden=hidden,
                root_token=root,
            )
        )
