"""The trial evaluator: speculative decoding over a domain split -> (A, M, C) and details.

It follows the evaluator contract of :mod:`tss_opt.search` (``num_layers``; called with a
``frozenset[int]`` skip set; returns ``accept_length``, ``metric``, ``cost`` and extra keys),
so the search, the held-out report and user code share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tss_opt.evaluation.cost import COSTS, analytic_cost, measured_cost
from tss_opt.evaluation.decoding.drafter import Drafter
from tss_opt.evaluation.decoding.engine import SpeculativeEngine
from tss_opt.evaluation.decoding.stats import DecodeStats
from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.domains import Example, format_prompt
from tss_opt.evaluation.metrics import Metric

log = logging.getLogger(__name__)


@dataclass
class PromptRecord:
    """One prompt's outcome under one skip set."""

    id: str
    output: str
    score: float
    accept_length: float
    tokens_per_s: float
    new_tokens: int
    steps: int


@dataclass
class EvalResult:
    """A, M, C of a skip set on a prompt set, with the details behind them."""

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

    def to_dict(self) -> dict[str, Any]:
        """The evaluator-contract mapping; extras become trial user attributes."""
        return {
            "accept_length": self.accept_length,
            "metric": self.metric,
            "cost": self.cost,
            "cost_analytic": self.cost_analytic,
            "cost_measured": self.cost_measured,
            "tokens_per_s": self.tokens_per_s,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "wall_s": self.wall_s,
            "metric_extras": dict(self.metric_extras),
            "per_prompt_score": [round(p.score, 4) for p in self.prompts],
        }


class SpecDecodeEvaluator:
    """Runs the engine over ``examples`` with a skip set and scores the outputs.

    Args:
        target: the verifier (its skip mechanism applies the trial's skip set).
        tokenizer: formats prompts (chat template when present) and decodes outputs.
        drafter_factory: builds a fresh drafter per evaluation, so that online-learning
            drafters (Token Recycling) start equal and same inputs give the same A and M.
        examples: the domain split to run.
        metric: the objective metric; ``extra_metrics`` are reported beside it.
        max_new_tokens: generation length per prompt.
        scope: skip scope, ``"verify"`` (paper) or ``"all"``.
        cost: ``"analytic"`` (default) or ``"measured"``: which cost is the objective
            (both are recorded).
        eos_token_ids: stop tokens.
        system_prompt: optional system message for chat templates.
        show_progress: log one line per prompt.
    """

    def __init__(
        self,
        target: TargetModel,
        tokenizer: Any,
        drafter_factory: Callable[[], Drafter | None],
        examples: Sequence[Example],
        metric: Metric,
        *,
        extra_metrics: Sequence[Metric] = (),
        max_new_tokens: int = 96,
        scope: str = "verify",
        temperature: float = 0.0,
        cost: str = "analytic",
        eos_token_ids: Sequence[int] = (),
        system_prompt: str | None = None,
        show_progress: bool = True,
    ) -> None:
        if cost not in COSTS:
            raise ValueError(f"cost={cost!r} is not a cost; expected one of {', '.join(COSTS)}")
        if not examples:
            raise ValueError("the evaluator got no prompts; check the domain's split sizes")
        self.target = target
        self.tokenizer = tokenizer
        self.drafter_factory = drafter_factory
        self.examples = list(examples)
        self.metric = metric
        self.extra_metrics = list(extra_metrics)
        self.max_new_tokens = max_new_tokens
        self.scope = scope
        self.temperature = temperature
        self.cost = cost
        self.eos_token_ids = tuple(eos_token_ids)
        self.show_progress = show_progress
        self.num_layers = target.num_layers
        self.metric_name = metric.name
        self.metric_higher_is_better = metric.higher_is_better
        # Tokenise once: every trial runs the same prompts.
        self.prompt_ids: list[torch.Tensor] = [format_prompt(tokenizer, ex, system_prompt) for ex in self.examples]

    def __call__(self, skip: frozenset[int]) -> dict[str, Any]:
        return self.evaluate(skip).to_dict()

    def evaluate(self, skip: frozenset[int] | Sequence[int] = frozenset()) -> EvalResult:
        """Measure one skip set on every prompt."""
        skip = frozenset(int(i) for i in skip)
        engine = SpeculativeEngine(self.target, self.drafter_factory(), eos_token_ids=self.eos_token_ids)
        outputs: list[str] = []
        stats = []
        t0 = time.perf_counter()
        for i, ids in enumerate(self.prompt_ids):
            res = engine.generate(
                ids, max_new_tokens=self.max_new_tokens, skip=skip, scope=self.scope, temperature=self.temperature, seed=i
            )
            text = self.tokenizer.decode(res.tokens, skip_special_tokens=True)
            outputs.append(text)
            stats.append(res.stats)
            if self.show_progress:
                log.info(
                    "  skip=%s prompt %d/%d: A=%.2f %.1f tok/s", sorted(skip), i + 1, len(self.examples),
                    res.stats.accept_length, res.stats.tokens_per_s,
                )
        return aggregate(
            skip, self.examples, outputs, stats, self.metric, self.extra_metrics, self.num_layers,
            wall_s=time.perf_counter() - t0, cost=self.cost,
        )


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
) -> EvalResult:
    """Score one skip set's outputs and total its statistics.

    A = committed tokens / verification steps pooled over prompts; tokens/s = the mean over
    prompts of tokens / wall time (TSS.md's conventions). Shared by the evaluator and the
    held-out report, which interleaves two skip sets and so cannot call ``evaluate``.
    """
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
        prompts=[
            PromptRecord(
                id=ex.id, output=out, score=sc, accept_length=s.accept_length,
                tokens_per_s=s.tokens_per_s, new_tokens=s.new_tokens, steps=s.steps,
            )
            for ex, out, sc, s in zip(examples, outputs, scored.per_example, stats)
        ],
    )
