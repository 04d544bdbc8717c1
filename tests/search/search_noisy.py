"""A synthetic evaluator with per-prompt noise and a planted truth (for the paired-feasibility tests).

Each prompt i has a dense accepted length ``a0_i`` and metric ``m0_i`` (prompt difficulty).
Skipping S shifts every prompt by the *true* effect of S (the sum of its layers' effects)
plus prompt-level noise ``sigma * z_i(S)``, drawn from a seed that depends on (seed, S, i):
the same skip set always gives the same numbers, different sets independent noise. A set is
*truly* feasible when its true effects stay within eps of the population dense means
(``A0 = 3``, ``M0 = 0.5``), whatever the sample says.

Supports the early-stopping contract: ``num_prompts`` and ``evaluator(skip, prompt_ids=...)``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

A0, M0 = 3.0, 0.5


class NoisyLandscape:
    """Per-prompt noisy evaluator.

    Args:
        effects: Per layer ``(accept effect, metric effect, cost factor[, repetition effect])``:
            the true mean shift of skipping the layer and its relative cost saving.
        seed: Draws prompt difficulties and noise.
        num_prompts: Prompts per full evaluation.
        sigma_accept, sigma_metric: Prompt-level noise of a skip set's effect.
        chunked: Expose ``num_prompts`` / ``prompt_ids=`` (early stopping).
        per_prompt: Return ``per_prompt`` at all.
    """

    metric_name = "f1"

    def __init__(
        self,
        effects: Sequence[tuple[float, ...]],
        seed: int = 0,
        *,
        num_prompts: int = 16,
        sigma_accept: float = 0.3,
        sigma_metric: float = 0.05,
        chunked: bool = False,
        per_prompt: bool = True,
    ) -> None:
        self.effects = [tuple(e) + (0.0,) * (4 - len(e)) for e in effects]
        self.num_layers = len(effects)
        self.seed = seed
        self.n = num_prompts
        if chunked:
            self.num_prompts = num_prompts
        self.sigma_a = sigma_accept
        self.sigma_m = sigma_metric
        self.with_per_prompt = per_prompt
        rng = random.Random(f"dense:{seed}")
        self.a0 = [A0 + rng.gauss(0, 0.5) for _ in range(num_prompts)]
        self.m0 = [M0 + rng.gauss(0, 0.1) for _ in range(num_prompts)]
        self.calls = 0
        self.prompt_evaluations = 0

    def true_effect(self, skip: frozenset[int]) -> tuple[float, float, float]:
        return (
            sum(self.effects[i][0] for i in skip),
            sum(self.effects[i][1] for i in skip),
            sum(self.effects[i][3] for i in skip),
        )

    def truly_feasible(self, skip: frozenset[int], eps: float = 0.05) -> bool:
        da, dm, _ = self.true_effect(skip)
        return da >= -eps * A0 and dm >= -eps * M0

    def cost(self, skip: frozenset[int]) -> float:
        c = 1.0
        for i in skip:
            c *= 1.0 - self.effects[i][2]
        return c

    def prompt(self, skip: frozenset[int], i: int) -> dict[str, float]:
        da, dm, dr = self.true_effect(skip)
        if not skip:
            return {"accept_length": self.a0[i], "metric": self.m0[i], "tokens": 32.0, "repetition": 0.05}
        rng = random.Random(f"{self.seed}:{sorted(skip)}:{i}")
        return {
            "accept_length": self.a0[i] + da + self.sigma_a * rng.gauss(0, 1),
            "metric": self.m0[i] + dm + self.sigma_m * rng.gauss(0, 1),
            "tokens": 32.0,
            "repetition": min(1.0, max(0.0, 0.05 + dr + 0.02 * rng.gauss(0, 1))),
        }

    def __call__(self, skip: frozenset[int], prompt_ids: Sequence[int] | None = None) -> dict[str, Any]:
        self.calls += 1
        ids = list(range(self.n)) if prompt_ids is None else list(prompt_ids)
        rows = [self.prompt(frozenset(skip), i) for i in ids]
        self.prompt_evaluations += len(ids)
        out: dict[str, Any] = {
            "accept_length": statistics.fmean(r["accept_length"] for r in rows),
            "metric": statistics.fmean(r["metric"] for r in rows),
            "cost": self.cost(frozenset(skip)),
            "tokens_per_s": 100.0,
        }
        if self.with_per_prompt:
            out["per_prompt"] = rows
        return out


# Planted truth for the rate test: layers 0 and 3 harmless and slightly cheaper; layer 1 loses
# metric and layer 2 acceptance, each one standard error (16 prompts) beyond the 5 % tolerance;
# 1 and 2 are the cheap layers, so a lucky sample makes a set with them S*.
RATE_EFFECTS = [
    (0.0, 0.0, 0.03),
    (0.0, -(0.025 + 0.0125), 0.10),
    (-(0.15 + 0.075), 0.0, 0.08),
    (0.0, 0.0, 0.02),
]
