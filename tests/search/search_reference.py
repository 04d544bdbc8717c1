"""An independent brute-force implementation of Algorithm 1 for the tests.

Written from the task statement with plain loops over ``itertools.combinations``; it shares
no code with ``tss_opt.search``. Conventions the engine documents and this follows:
configurations of a level are evaluated in ascending sorted-tuple order, ``max_trials``
counts evaluated configurations (baseline included), and the tie rules of the selections.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reference:
    evaluated: dict[frozenset[int], dict[str, Any]] = field(default_factory=dict)
    levels: list[tuple[int, int, int]] = field(default_factory=list)  # (k, evaluated, feasible)
    pool: tuple[int, ...] = ()
    feasible: list[frozenset[int]] = field(default_factory=list)
    pareto: set[frozenset[int]] = field(default_factory=set)
    best: frozenset[int] = frozenset()


def reference_search(
    measure: Callable[[frozenset[int]], dict[str, Any]],
    num_layers: int,
    *,
    mode: str = "exhaustive",
    beam_width: int = 3,
    max_depth: int = 5,
    eps_accept: float = 0.05,
    eps_metric: float = 0.05,
    tau_accept: float = 0.05,
    tau_metric: float = 0.05,
    relative: bool = True,
    early_barrier: int = 0,
    latter_barrier: int = 0,
    selection: str = "min_cost",
    max_trials: int | None = None,
    higher_is_better: bool = True,
) -> Reference:
    ref = Reference()
    budget = max_trials if max_trials is not None else 10**9

    base = measure(frozenset())
    ref.evaluated[frozenset()] = base
    budget -= 1
    a0, m0 = base["accept_length"], base["metric"]

    if relative:
        thr_a = a0 * (1 - eps_accept)
        pool_a = a0 * (1 - tau_accept)
        thr_m = m0 * (1 - eps_metric) if higher_is_better else m0 * (1 + eps_metric)
        pool_m = m0 * (1 - tau_metric) if higher_is_better else m0 * (1 + tau_metric)
    else:
        thr_a = a0 - eps_accept
        pool_a = a0 - tau_accept
        thr_m = m0 - eps_metric if higher_is_better else m0 + eps_metric
        pool_m = m0 - tau_metric if higher_is_better else m0 + tau_metric

    def metric_ok(m: float, bound: float) -> bool:
        return m >= bound if higher_is_better else m <= bound

    def is_feasible(s: frozenset[int]) -> bool:
        r = ref.evaluated[s]
        return r["accept_length"] >= thr_a and metric_ok(r["metric"], thr_m)

    ref.levels.append((0, 1, 1))
    ref.feasible.append(frozenset())

    level_sets: list[frozenset[int]] = []
    k = 1
    previous_feasible: list[frozenset[int]] = []
    while budget > 0 and k <= max_depth:
        if k == 1:
            candidates = [
                frozenset([layer]) for layer in range(early_barrier, num_layers - latter_barrier)
            ]
        elif mode == "exhaustive":
            candidates = [frozenset(c) for c in itertools.combinations(ref.pool, k)]
        else:

            def rank(s: frozenset[int]) -> tuple:
                r = ref.evaluated[s]
                return (-r["accept_length"], -len(s), -r["tokens_per_s"], tuple(sorted(s)))

            parents = sorted(previous_feasible, key=rank)[:beam_width]
            children = set()
            for p in parents:
                for layer in ref.pool:
                    if layer not in p:
                        children.add(p | {layer})
            candidates = sorted(children, key=lambda s: tuple(sorted(s)))
        candidates = sorted(candidates, key=lambda s: tuple(sorted(s)))
        if not candidates:
            break
        level_sets = candidates[:budget]
        budget -= len(level_sets)
        for s in level_sets:
            ref.evaluated[s] = measure(s)
        feas = [s for s in level_sets if is_feasible(s)]
        ref.levels.append((k, len(level_sets), len(feas)))
        ref.feasible.extend(feas)
        if k == 1:
            pool = []
            for s in level_sets:
                r = ref.evaluated[s]
                if r["accept_length"] >= pool_a or metric_ok(r["metric"], pool_m):
                    pool.append(next(iter(s)))
            ref.pool = tuple(sorted(pool))
        if not feas:
            break
        previous_feasible = feas
        k += 1

    # Pareto: brute force over feasible sets (acceptance up, metric up/down, cost down).
    sign = 1 if higher_is_better else -1

    def vec(s: frozenset[int]) -> tuple[float, float, float]:
        r = ref.evaluated[s]
        return (r["accept_length"], sign * r["metric"], -r["cost"])

    for s in ref.feasible:
        dominated = False
        for t in ref.feasible:
            vs, vt = vec(s), vec(t)
            if all(x >= y for x, y in zip(vt, vs, strict=True)) and any(
                x > y for x, y in zip(vt, vs, strict=True)
            ):
                dominated = True
                break
        if not dominated:
            ref.pareto.add(s)

    if selection == "min_cost":

        def cost_key(s: frozenset[int]) -> tuple:
            r = ref.evaluated[s]
            return (r["cost"], -r["accept_length"], -sign * r["metric"], -len(s), tuple(sorted(s)))

        ref.best = min(ref.feasible, key=cost_key)
    else:
        tps0 = base["tokens_per_s"]
        wins = []
        for s, r in ref.evaluated.items():
            if not s:
                continue
            if (
                metric_ok(r["metric"], m0)
                and r["accept_length"] >= a0
                and r["tokens_per_s"] >= tps0
            ):
                wins.append(s)

        def win_key(s: frozenset[int]) -> tuple:
            r = ref.evaluated[s]
            return (-r["accept_length"], -len(s), -r["tokens_per_s"], tuple(sorted(s)))

        ref.best = min(wins, key=win_key) if wins else frozenset()
    return ref
