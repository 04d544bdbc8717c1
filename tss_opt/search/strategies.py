"""Rival search strategies on the TSS study space (the paper's Table 2 comparison).

Every strategy searches the same space (one boolean ``skip_<i>`` per layer, barriers
respected), with the same evaluator, feasibility rule (:func:`feasibility_rule`, the rule of
:mod:`tss_opt.search.algorithm`), budget (``max_trials`` evaluated skip sets, the dense
baseline included) and final selection (``selection`` over every evaluated set), and writes
trials of the same shape as the breadth-first search.

Deterministic strategies are *planners*: pure functions from the stored results to a
:class:`~tss_opt.search.algorithm.SearchPlan`, run by
:class:`~tss_opt.search.BreadthFirstSampler` through the same queue and workers as the
breadth-first search (so several workers and resume work unchanged). A "level" of a plan is one step of the strategy:

- ``sleb``: step k evaluates ``S_{k-1} + {l}`` for every allowed layer ``l`` not in
  ``S_{k-1}``; ``S_k`` is the candidate with the best quality score (``sleb_score``: the task
  metric on the calibration prompts by default, or the accepted length; ties: the other
  objective, then lower cost, then the sorted tuple). Like SLEB, it removes layers until
  ``max_depth`` (or the budget) whatever their feasibility.
- ``gm_skip``: the same greedy steps ranked by the task metric, stopping at the first step
  whose best candidate breaks the metric bound (GM-Skip's tolerance stop).
- ``random``: skip sets drawn uniformly, sizes cycling 1, 2, ..., ``max_depth``, no set twice,
  from ``random.Random(seed)``; all drawn at once after the baseline (one step).
- ``accept_only`` / ``metric_only``: :func:`~tss_opt.search.algorithm.plan_search` in beam
  mode with the pool, the search-time feasibility and the beam ranking on one objective.

``tpe``, ``nsga2`` and ``gp`` run Optuna's samplers (:mod:`tss_opt.search.optuna_strategy`).

What differs between modes is declared once on the mode
(:class:`~tss_opt.config.search.ModeSpec`) and turned into functions by
:mod:`tss_opt.search.registry`; the planners are in
:mod:`tss_opt.search.planners`. This module keeps the shared feasibility rule and re-exports
both for existing imports.
"""

from __future__ import annotations

from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import Feasibility, Measurement, feasibility_for
from tss_opt.search.planners import plan_greedy, plan_random, random_sequence
from tss_opt.search.registry import QUEUED_MODES, check_budget, first_level_size, plan_strategy

__all__ = [
    "QUEUED_MODES",
    "check_budget",
    "feasibility_rule",
    "first_level_size",
    "plan_greedy",
    "plan_random",
    "plan_strategy",
    "random_sequence",
]


def feasibility_rule(
    baseline: Measurement, settings: SearchSettings, *, metric_higher_is_better: bool = True
) -> Feasibility:
    """The feasibility rule every strategy's final selection uses: the search's own
    (:func:`~tss_opt.search.algorithm.feasibility_for`: paired when ``feasibility: paired``
    and the evaluator gives per-prompt values, else the point rule), so a rival strategy is
    judged exactly as the breadth-first search and the worker judge its trials."""
    return feasibility_for(baseline, settings, metric_higher_is_better=metric_higher_is_better)

