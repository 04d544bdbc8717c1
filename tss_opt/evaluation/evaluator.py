"""The trial evaluator: speculative decoding over a domain split -> (A, M, C) and details.

It follows the evaluator contract of :mod:`tss_opt.search` (``num_layers``; called with a
``frozenset[int]`` skip set; returns ``accept_length``, ``metric``, ``cost`` and extra keys),
so the search, the held-out report and user code share it. It also implements the contract's
per-prompt extension (docs/evaluator.md): a ``per_prompt`` list in the result, ``num_prompts``
and ``evaluator(skip, prompt_ids=[...])`` for evaluating a subset (early stopping).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from tss_opt.config.enums import Verification
from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.prefill import DensePrefill, PrefillStore, dense_prefill
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.verify.relaxed import Verifier
from tss_opt.evaluation.cost import COSTS, analytic_cost, measured_cost
from tss_opt.evaluation.domains import Example, format_prompt
from tss_opt.evaluation.metrics import Metric
from tss_opt.evaluation.metrics.repetition import repeated_ngram_share
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.progress import prompts_done

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger(__name__)


@dataclass
class PromptRecord:
    """One prompt's outcome under one skip set.

    Attributes:
        id: the example's id.
        output: the decoded output text.
        score: the objective metric on this prompt alone.
        accept_length: this prompt's committed tokens / verification steps.
        tokens_per_s: generated tokens / wall time of this prompt.
        new_tokens: generated tokens.
        steps: verification steps.
        index: the prompt's position in the evaluator's prompt list.
        token_ids: the generated token ids (empty when the caller did not pass them).
        repetition: share of repeated 4-grams of ``token_ids`` (metrics/repetition.py).
    """

    id: str
    output: str
    score: float
    accept_length: float
    tokens_per_s: float
    new_tokens: int
    steps: int
    index: int = -1
    token_ids: tuple[int, ...] = ()
    repetition: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The compact per-prompt mapping of the evaluator contract (no text, no token ids)."""
        return {
            "index": self.index,
            "id": self.id,
            ACCEPT_LENGTH: self.accept_length,
            METRIC: self.score,
            "tokens": self.new_tokens,
            "steps": self.steps,
            "repetition": self.repetition,
            "tokens_per_s": self.tokens_per_s,
        }


# What produced an evaluation's figures (so that a table can say what it measured). "engine":
# speculative decoding ran and was timed, so tokens/s is a decoding speed; "replay": the sparse
# target's greedy outputs were generated in batches and the drafter replayed over them, so A and
# M are the engine's but no decoding was timed.
EVALUATOR_KINDS = ("engine", "replay")


@dataclass
class EvalResult:
    """A, M, C of a skip set on a prompt set, with the details behind them.

    ``evaluator`` says what produced the figures (:data:`EVALUATOR_KINDS`) and ``cost_kind``
    which cost is ``cost`` (``analytic`` or ``measured``). Under ``replay``, ``tokens_per_s``
    is the batched replay's throughput, not a decoding speed: :meth:`to_dict` then names it
    ``replay_tokens_per_s``, so no table or dashboard reads it as speed.
    """

    skip: frozenset[int]
    accept_length: float
    metric: float
    cost: float
    cost_analytic: float
    cost_measured: float
    tokens_per_s: float
    new_tokens: int
    steps: int
    wall_s: float
    metric_extras: dict[str, float] = field(default_factory=dict)
    prompts: list[PromptRecord] = field(default_factory=list)
    verification: str = "exact"  # the acceptance rule; anything else is lossy
    evaluator: str = "engine"  # EVALUATOR_KINDS: what produced the figures
    cost_kind: str = "analytic"  # which cost `cost` is

    @property
    def lossy(self) -> bool:
        return Verification.lossy_label(self.verification)

    @property
    def decoding_timed(self) -> bool:
        """``tokens_per_s`` is a speculative-decoding speed (the engine ran and was timed)."""
        return self.evaluator == "engine"

    def to_dict(self) -> dict[str, Any]:
        """The evaluator-contract mapping; extras become trial user attributes."""
        return {
            ACCEPT_LENGTH: self.accept_length,
            METRIC: self.metric,
            COST: self.cost,
            "cost_analytic": self.cost_analytic,
            "cost_measured": self.cost_measured,
            # A decoding speed only where decoding was timed (the search reads "tokens_per_s").
            ("tokens_per_s" if self.decoding_timed else f"{self.evaluator}_tokens_per_s"): self.tokens_per_s,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "wall_s": self.wall_s,
            "metric_extras": dict(self.metric_extras),
            "per_prompt_score": [round(p.score, 4) for p in self.prompts],
            "per_prompt": [p.to_dict() for p in self.prompts],
            "verification": self.verification,
            "lossy": self.lossy,
            "evaluator": self.evaluator,
            "cost_kind": self.cost_kind,
        }


def check_prompt_ids(prompt_ids: Iterable[int] | None, num_prompts: int) -> list[int]:
    """The prompt indices an evaluation runs, in order (``None``: all), checked.

    Shared by every evaluator that accepts ``prompt_ids=`` (engine and replay).

    Raises:
        ValueError: empty, outside ``[0, num_prompts)``, or repeated indices.
    """
    if prompt_ids is None:
        return list(range(num_prompts))
    order = [int(i) for i in prompt_ids]
    if not order:
        raise ValueError("prompt_ids is empty; pass at least one prompt index, or None for all prompts")
    bad = [i for i in order if not 0 <= i < num_prompts]
    if bad:
        raise ValueError(
            f"prompt_ids {bad} are outside 0..{num_prompts - 1}; the evaluator has "
            f"{num_prompts} prompts (see num_prompts)"
        )
    if len(set(order)) != len(order):
        dup = sorted({i for i in order if order.count(i) > 1})
        raise ValueError(f"prompt_ids repeats {dup}; pass each prompt index once")
    return order


class PromptSetEvaluator(ABC):
    """What every trial evaluator over a fixed prompt list shares: its :class:`PromptSet`,
    the tokenised prompts, ``num_prompts``, the contract's ``__call__``, :meth:`on_examples`
    and the scoring of a run (:func:`aggregate`).

    Every evaluator is built the same way, ``Evaluator(target, tokenizer, drafter_factory,
    prompts, **options)``; subclasses check their prompt set, then call ``super().__init__``;
    they implement :meth:`evaluate` and add their own options to :meth:`_options`.

    Args:
        target: the verifier (its skip mechanism applies the trial's skip set).
        tokenizer: formats prompts (chat template when present) and decodes outputs.
        drafter_factory: builds a fresh drafter per evaluation.
        prompts: the prompts, their metrics and how every prompt is decoded (non-empty: the
            subclass checks it).
        show_progress: log a DEBUG line per prompt (or batch); a caller's
            :func:`tss_opt.progress.prompt_bar` advances either way.
        prefill_store_gib: the byte budget of the kept prefills, in GiB (least recently used
            evicted; ``None`` = ``decoding.prefill.DEFAULT_PREFILL_STORE_GIB``). A resource
            limit, not part of the protocol: outputs do not depend on it.
    """

    def __init__(
        self,
        target: TargetModel,
        tokenizer: Any,
        drafter_factory: Callable[[], Drafter | None],
        prompts: PromptSet,
        *,
        show_progress: bool = True,
        prefill_store_gib: float | None = None,
    ) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.drafter_factory = drafter_factory
        self.prompts = prompts
        self.show_progress = show_progress
        self.num_layers = target.num_layers
        self.metric_name = prompts.metric.name
        self.metric_higher_is_better = prompts.metric.higher_is_better
        self.prefill_store_gib = prefill_store_gib
        # Kept dense prefills under a byte budget (decoding/prefill.py), by prompt index.
        self._prefills: PrefillStore[Any, Any] = PrefillStore.from_gib(prefill_store_gib)
        # Tokenise once: every trial runs the same prompts.
        self.prompt_tokens: list[torch.Tensor] = [
            format_prompt(tokenizer, ex, prompts.protocol.system_prompt) for ex in prompts.examples
        ]

    kind: ClassVar[str] = "engine"
    """What produces this evaluator's figures (:data:`EVALUATOR_KINDS`); results carry it."""

    # The prompt set's parts and the protocol's fields, read-only: they are fixed at
    # construction (build another evaluator with ``ev.prompts.replace(...)``).
    examples = property(lambda self: self.prompts.examples)
    metric = property(lambda self: self.prompts.metric)
    extra_metrics = property(lambda self: self.prompts.extra_metrics)
    protocol = property(lambda self: self.prompts.protocol)
    max_new_tokens = property(lambda self: self.protocol.max_new_tokens)
    scope = property(lambda self: self.protocol.scope)
    temperature = property(lambda self: self.protocol.temperature)
    cost = property(lambda self: self.protocol.cost)
    eos_token_ids = property(lambda self: self.protocol.eos_token_ids)
    system_prompt = property(lambda self: self.protocol.system_prompt)
    reuse_prefill = property(lambda self: self.protocol.reuse_prefill)

    def _options(self) -> dict[str, Any]:
        """The keyword options that rebuild this evaluator (on other prompts)."""
        return {"show_progress": self.show_progress, "prefill_store_gib": self.prefill_store_gib}

    def _current_prompts(self) -> PromptSet:
        """The prompt set as it now runs (a subclass may hold a swapped part)."""
        return self.prompts

    def release_prefills(self) -> None:
        """Drop the kept prefills (before validation runs its own prompts: one store at a time)."""
        self._prefills.clear()

    def on_examples(self, examples: Sequence[Example]) -> Self:
        """The same model, drafter, metric and protocol on other prompts (the validation split
        checks the search's candidates this way, with the model loaded once)."""
        return type(self)(
            self.target, self.tokenizer, self.drafter_factory, self._current_prompts().on(examples), **self._options()
        )

    @property
    def num_prompts(self) -> int:
        """Prompts in the evaluator's list (valid ``prompt_ids`` are ``0 .. num_prompts - 1``)."""
        return len(self.examples)

    def __call__(self, skip: frozenset[int], prompt_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """The evaluator contract: aggregates and ``per_prompt`` over ``prompt_ids`` (all if None)."""
        return self.evaluate(skip, prompt_ids=prompt_ids).to_dict()

    @abstractmethod
    def evaluate(
        self, skip: frozenset[int] | Sequence[int] = frozenset(), prompt_ids: Sequence[int] | None = None
    ) -> EvalResult:
        """Measure one skip set on every prompt, or on the prompts ``prompt_ids`` in that order."""

    def _prefill(self, i: int) -> DensePrefill | None:
        """Prompt ``i``'s kept dense prefill, computed on first use (``reuse_prefill`` in
        ``verify`` scope; else ``None``: the request prefills itself)."""
        if not self.reuse_prefill or self.scope != "verify":
            return None
        return self._prefills.get(i, lambda: dense_prefill(self.target, self.prompt_tokens[i]))

    def _check_prompt_ids(self, prompt_ids: Iterable[int] | None) -> list[int]:
        return check_prompt_ids(prompt_ids, self.num_prompts)

    def _aggregate(
        self,
        skip: frozenset[int],
        order: Sequence[int],
        outputs: Sequence[str],
        stats: Sequence[DecodeStats],
        tokens: Sequence[Sequence[int]],
        wall_s: float,
    ) -> EvalResult:
        """:func:`aggregate` over the prompts ``order`` (indices into the prompt list), whose
        outputs, statistics and generated token ids are given in that order."""
        return aggregate(
            skip, [self.examples[i] for i in order], outputs, stats, self.metric, self.extra_metrics,
            self.num_layers, wall_s=wall_s, cost=self.cost, tokens=tokens, indices=order, evaluator=self.kind,
        )


class SpecDecodeEvaluator(PromptSetEvaluator):
    """Runs the engine over a prompt set with a skip set and scores the outputs.

    Arguments as :class:`PromptSetEvaluator`. A fresh drafter per evaluation, so that
    online-learning drafters (Token Recycling) start equal and same inputs give the same A
    and M. Of the protocol, ``cost`` says which cost is the objective (both are recorded);
    ``reuse_prefill`` in ``"verify"`` scope prefills each prompt with the dense target once
    and starts every evaluation from a copy (decoding/prefill.py; same tokens, no prompt
    forward per trial; one KV cache per prompt is kept); ``verification`` is the acceptance
    rule, and results carry its label and ``lossy``.
    """

    def __init__(
        self,
        target: TargetModel,
        tokenizer: Any,
        drafter_factory: Callable[[], Drafter | None],
        prompts: PromptSet,
        *,
        show_progress: bool = True,
        prefill_store_gib: float | None = None,
    ) -> None:
        protocol = prompts.protocol
        if protocol.cost not in COSTS:
            raise ValueError(f"cost={protocol.cost!r} is not a cost; expected one of {', '.join(COSTS)}")
        if not prompts.examples:
            raise ValueError("the evaluator got no prompts; check the domain's split sizes")
        # A plain attribute: relaxed-weight tuning swaps it for one evaluation.
        self.verifier: Verifier = protocol.verifier
        super().__init__(
            target, tokenizer, drafter_factory, prompts, show_progress=show_progress, prefill_store_gib=prefill_store_gib
        )
        # (skip, next index, drafter) of the last call whose prompts were 0, 1, ..., k - 1:
        # a call for the same skip set starting at k continues with that drafter, so chunked
        # evaluation equals one full call even for drafters that learn across prompts.
        self._chain: tuple[frozenset[int], int, Drafter | None] | None = None

    def _current_prompts(self) -> PromptSet:
        return self.prompts.replace(protocol=self.protocol.replace(verification=self.verifier))

    def evaluate(
        self, skip: frozenset[int] | Sequence[int] = frozenset(), prompt_ids: Sequence[int] | None = None
    ) -> EvalResult:
        """Measure one skip set on every prompt, or on the prompts ``prompt_ids`` in that order.

        Args:
            skip: target layers to bypass.
            prompt_ids: indices into the evaluator's prompt list; ``None`` = all, in order. A
                prompt's figures do not depend on which others run with it (its sampling seed
                is its index); for a drafter that learns across prompts (Token Recycling) this
                holds when the calls cover ``0, 1, 2, ...`` in order, chunk after chunk.

        Raises:
            ValueError: for an empty ``prompt_ids``, an index outside ``[0, num_prompts)`` or a
                repeated index.
        """
        skip = frozenset(int(i) for i in skip)
        order = self._check_prompt_ids(prompt_ids)
        drafter = self._drafter_for(skip, order)
        engine = self.protocol.engine(self.target, drafter, verification=self.verifier)
        outputs: list[str] = []
        tokens: list[list[int]] = []
        stats = []
        t0 = time.perf_counter()
        for n, i in enumerate(order):
            res = engine.generate(
                self.prompt_tokens[i], skip=skip, seed=i, prefill=self._prefill(i), **self.protocol.generate_kwargs()
            )
            outputs.append(self.tokenizer.decode(res.tokens, skip_special_tokens=True))
            tokens.append(res.tokens.tolist())
            stats.append(res.stats)
            prompts_done(1)  # a caller's prompt bar, if one is open
            if self.show_progress:  # per prompt: DEBUG (the search logs one INFO line per trial)
                log.debug(
                    "  skip=%s prompt %d/%d: A=%.2f %.1f tok/s", sorted(skip), n + 1, len(order),
                    res.stats.accept_length, res.stats.tokens_per_s,
                )
        result = self._aggregate(skip, order, outputs, stats, tokens, wall_s=time.perf_counter() - t0)
        result.verification = self.verifier.describe()
        return result

    def _drafter_for(self, skip: frozenset[int], order: list[int]) -> Drafter | None:
        """A fresh drafter, or the previous call's when this call continues its run of 0..k-1."""
        contiguous = order == list(range(order[0], order[0] + len(order)))
        chain = self._chain
        if contiguous and chain is not None and chain[0] == skip and chain[1] == order[0]:
            drafter = chain[2]
        elif contiguous and order[0] == 0:
            drafter = self.drafter_factory()
        else:
            self._chain = None
            return self.drafter_factory()
        self._chain = (skip, order[-1] + 1, drafter)
        return drafter


def aggregate(
    skip: frozenset[int],
    examples: Sequence[Example],
    outputs: Sequence[str],
    stats: Sequence[DecodeStats],
    metric: Metric,
    extra_metrics: Sequence[Metric],
    num_layers: int,
    *,
    wall_s: float,
    cost: str = "analytic",
    tokens: Sequence[Sequence[int]] | None = None,
    indices: Sequence[int] | None = None,
    evaluator: str = "engine",
) -> EvalResult:
    """Score one skip set's outputs and total its statistics.

    A = committed tokens / verification steps pooled over prompts; tokens/s = the mean over
    prompts of tokens / wall time (TSS.md's conventions). Shared by the evaluator and the
    held-out report, which interleaves two skip sets and so cannot call ``evaluate``.

    Args:
        tokens: per prompt, the generated token ids; give them for the per-prompt
            ``repetition`` (0.0 without).
        indices: per prompt, its index in the caller's prompt list (default 0, 1, ...).
        evaluator: what produced ``stats`` (:data:`EVALUATOR_KINDS`; ``replay``: their
            timings are not decoding's).
    """
    token_lists = [tuple(int(t) for t in ts) for ts in tokens] if tokens is not None else [()] * len(examples)
    index_list = list(indices) if indices is not None else list(range(len(examples)))
    refs = [ex.references for ex in examples]
    scored = metric.score(list(outputs), refs)
    extras = dict(scored.extras)
    for m in extra_metrics:
        extras[m.name] = m.score(list(outputs), refs).value
    steps = sum(s.steps for s in stats)
    step_tokens = sum(s.step_tokens for s in stats)
    A = step_tokens / steps if steps else 1.0
    c_an = analytic_cost(num_layers, len(skip), A)
    c_me = measured_cost(sum(s.verify_s for s in stats), step_tokens)
    return EvalResult(
        skip=skip,
        accept_length=A,
        metric=scored.value,
        cost=c_an if cost == "analytic" else c_me,
        cost_analytic=c_an,
        cost_measured=c_me,
        tokens_per_s=sum(s.tokens_per_s for s in stats) / len(stats),
        new_tokens=sum(s.new_tokens for s in stats),
        steps=steps,
        wall_s=wall_s,
        metric_extras=extras,
        evaluator=evaluator,
        cost_kind=cost,
        prompts=[
            PromptRecord(
                id=ex.id, output=out, score=sc, accept_length=s.accept_length,
                tokens_per_s=s.tokens_per_s, new_tokens=s.new_tokens, steps=s.steps,
                index=idx, token_ids=toks, repetition=repeated_ngram_share(toks),
            )
            for ex, out, sc, s, idx, toks in zip(
                examples, outputs, scored.per_example, stats, index_list, token_lists, strict=True
            )
        ],
    )
