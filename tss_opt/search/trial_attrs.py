"""What every evaluated trial records, whichever strategy ran it (one writer for the queued
workers and Optuna's samplers).

User attributes (read in the dashboard and by the results): the evaluator's extras,
``feasible``, ``per_prompt`` (compact, 4 decimals: feasibility is recomputed from it),
``prompts_used`` / ``early_stopped`` (chunked evaluation), ``infeasible_reason``,
``paired_bounds``; and the constraints, twice: through Optuna's ``Trial.set_constraint``
(read by ``study.best_trials`` and the samplers) and as the legacy list under the system
attribute ``constraints`` that optuna-dashboard 0.21 reads (the one ``constraints_func``
writes): point rule ``[(A0 - eps_A) - A, (M0 - eps_M) - M]``; paired rule ``[-delta_A -
lower_A, -delta_M - lower_M(, lower_R - max_repetition_increase)]``; feasible when all <= 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from tss_opt.search.algorithm import Measurement
from tss_opt.search.feasibility import Verdict
from tss_opt.storage.optuna_adapter import study_storage, trial_id

__all__ = ["record_constraints", "record_evaluation"]


def record_constraints(
    study: optuna.Study, trial: optuna.Trial, verdict: Verdict, metric_name: str
) -> None:
    """Write the verdict's constraints (Optuna's API and the dashboard's legacy list)."""
    constraints = list(verdict.constraints)
    for name, value in zip(verdict.constraint_names, constraints, strict=True):
        trial.set_constraint(metric_name if name == "metric" else name, value)
    study_storage(study).set_trial_system_attr(trial_id(trial), "constraints", constraints)


def record_evaluation(
    study: optuna.Study,
    trial: optuna.Trial,
    m: Measurement,
    extras: Mapping[str, Any],
    verdict: Verdict,
    *,
    metric_name: str,
    prompts_used: int | None = None,
    early_stopped: bool = False,
) -> None:
    """Write one evaluation's attributes and constraints on its RUNNING trial."""
    for key, value in extras.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("feasible", verdict.feasible)
    if m.per_prompt is not None:
        trial.set_user_attr("per_prompt", m.per_prompt.to_dict())
    if prompts_used is not None:
        trial.set_user_attr("prompts_used", prompts_used)
        trial.set_user_attr("early_stopped", early_stopped)
    if not verdict.feasible:
        trial.set_user_attr("infeasible_reason", verdict.reason)
    if verdict.bounds:
        trial.set_user_attr("paired_bounds", {k: b.to_dict() for k, b in verdict.bounds.items()})
    record_constraints(study, trial, verdict, metric_name)
