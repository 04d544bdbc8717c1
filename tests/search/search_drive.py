"""A pure, in-memory driver of Algorithm 1 for many-seed tests (no Optuna, no storage).

It mirrors the worker: ``plan_search`` says what to evaluate, ``chunked.drive`` evaluates
(in chunks with early stopping when asked), ``select`` picks S*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tss_opt.search import SearchSettings
from tss_opt.search.algorithm import (
    Config,
    Measurement,
    SearchPlan,
    feasibility_for,
    plan_search,
)
from tss_opt.search.chunked import ChunkedRun
from tss_opt.search.chunked import drive as evaluate
from tss_opt.search.feasibility import PairedFeasibility
from tss_opt.search.selection import select


@dataclass
class Driven:
    best: Config
    plan: SearchPlan
    results: dict[Config, Measurement | None]
    prompts: int
    stopped: dict[Config, str]


def drive(evaluator: Any, settings: SearchSettings, *, early: bool = False) -> Driven:
    results: dict[Config, Measurement | None] = {}
    prompts = 0
    stopped: dict[Config, str] = {}
    hib = getattr(evaluator, "metric_higher_is_better", True)
    while True:
        plan = plan_search(settings, evaluator.num_layers, results, metric_higher_is_better=hib)
        if plan.finished:
            break
        for c in plan.frontier:
            if not early:
                ev = evaluate(evaluator, ChunkedRun(c))
            else:
                rule = plan.thresholds if c and isinstance(plan.thresholds, PairedFeasibility) else None
                pool = None
                if rule is not None and len(c) == 1:
                    assert plan.baseline is not None
                    pool = feasibility_for(plan.baseline, settings, metric_higher_is_better=hib, pool=True)
                ev = evaluate(evaluator, ChunkedRun(
                    c, num_prompts=evaluator.num_prompts, chunk=settings.early_stop_chunk, rule=rule, pool_rule=pool,
                ))
            results[c] = ev.measurement
            prompts += ev.prompts_used or 0
            if ev.early_stopped:
                stopped[c] = ev.stop_reason
    best = select(settings.selection, plan, results, metric_higher_is_better=hib)
    return Driven(best, plan, results, prompts, stopped)
