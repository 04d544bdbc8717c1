"""Validation before the mapping: check the cheapest feasible candidates on unseen prompts.

A set chosen on the calibration prompts can win there by luck. After the search,
the ``k`` cheapest feasible candidates (by the ``min_cost`` order: cost, then higher
acceptance, better metric, more layers, sorted tuple) are evaluated on a *validation*
evaluator (the domain's validation split), paired against dense on the same prompts, with the
same paired rule as the search (:mod:`tss_opt.search.feasibility`: eps, ``relative``,
``confidence``, the repetition guard, the metric tolerance's floor ``eps_metric_abs``). The choice is the cheapest candidate that passes; when
none passes, dense (the empty set) with the reasons.

:func:`validate_candidates` returns a :class:`ValidationOutcome` whose :meth:`to_dict` is
stored on the study as the user attribute ``validation`` (``store_validation``) and read by
:func:`tss_opt.mapping.export_mapping`, which then writes the validated choice with its
calibration and validation figures.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tss_opt.config.search import SearchSettings
from tss_opt.progress import prompt_bar
from tss_opt.search.algorithm import Config, Measurement, canonical
from tss_opt.search.contract import (
    EvaluatorError,
    describe_evaluator,
    measurement_from,
    prompt_count,
)
from tss_opt.search.feasibility import PairedFeasibility
from tss_opt.search.result import SearchResult

__all__ = [
    "CandidateCheck",
    "ValidationOutcome",
    "cheapest_feasible",
    "store_validation",
    "validate_candidates",
]

VALIDATION_ATTR = "validation"

log = logging.getLogger("tss_opt.search")


@dataclass(frozen=True)
class CandidateCheck:
    """One candidate's calibration figures and validation result.

    Attributes:
        skip_set: The candidate.
        calibration: Its search figures (``accept_length``, ``metric``, ``cost`` and, under
            the paired rule, ``bounds``); empty when candidates were given as plain sets.
        validation: Its validation figures: mean ``accept_length`` and ``metric`` over the
            validation prompts, ``cost``, and ``bounds`` (paired differences to dense).
        passed: The paired rule holds on the validation prompts.
        reason: Why it failed ("" when it passed).
    """

    skip_set: tuple[int, ...]
    calibration: Mapping[str, Any]
    validation: Mapping[str, Any]
    passed: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "skip_set": list(self.skip_set),
            "calibration": dict(self.calibration),
            "validation": dict(self.validation),
            "passed": self.passed,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class ValidationOutcome:
    """What validation chose, and why.

    Attributes:
        chosen: The cheapest candidate that passed, or ``()`` (dense).
        reason: ``"passed validation"`` or why dense was kept.
        candidates: Every candidate checked, cheapest first.
        dense: Dense's validation figures (mean ``accept_length``, ``metric``, ``n``).
        confidence: The rule's one-sided confidence.
        num_prompts: Validation prompts.
    """

    chosen: tuple[int, ...]
    reason: str
    candidates: tuple[CandidateCheck, ...]
    dense: Mapping[str, Any] = field(default_factory=dict)
    confidence: float = 0.9
    num_prompts: int = 0

    @property
    def dense_kept(self) -> bool:
        return not self.chosen

    def check(self, skip_set: Iterable[int]) -> CandidateCheck | None:
        key = tuple(sorted(skip_set))
        return next((c for c in self.candidates if c.skip_set == key), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the study's ``validation`` user attribute)."""
        return {
            "chosen": list(self.chosen),
            "reason": self.reason,
            "dense_kept": self.dense_kept,
            "confidence": self.confidence,
            "num_prompts": self.num_prompts,
            "dense": dict(self.dense),
            "candidates": [c.to_dict() for c in self.candidates],
        }


def cheapest_feasible(result: SearchResult, k: int = 3) -> list[Config]:
    """The ``k`` cheapest feasible non-empty skip sets of a search (``min_cost`` order)."""
    sign = 1.0 if result.metric_higher_is_better else -1.0
    feasible = [r for r in result.trials if r.feasible and r.skip_set and not r.failed]
    feasible.sort(
        key=lambda r: (r.cost, -r.accept_length, -sign * r.metric, -len(r.skip_set), canonical(r.skip_set))  # type: ignore[operator]
    )
    return [r.skip_set for r in feasible[:k]]


def validate_candidates(
    result_or_candidates: SearchResult | Iterable[Iterable[int]],
    evaluator: Any,
    k: int = 3,
    *,
    settings: SearchSettings | None = None,
    metric_higher_is_better: bool | None = None,
    storage: Any = None,
    show_progress: bool = True,
) -> ValidationOutcome:
    """Evaluate the ``k`` cheapest feasible candidates and dense on ``evaluator``; choose.

    Args:
        result_or_candidates: A finished :class:`~tss_opt.search.SearchResult` (its ``k``
            cheapest feasible sets, with their calibration figures) or skip sets (cheapest
            first).
        evaluator: The validation evaluator; it must return ``per_prompt`` (>= 2 prompts).
        k: Candidates to check (default 3).
        settings: eps and the metric tolerance, ``relative``, ``confidence``,
            ``max_repetition_increase``; default: the result's settings (else ``SearchSettings()``).
        metric_higher_is_better: Default: the result's, else the evaluator's attribute.
        storage: With a ``SearchResult``: also store the outcome on its study (user
            attribute ``validation``, see :func:`store_validation`).
        show_progress: A bar of the validation prompts on a terminal
            (:mod:`tss_opt.progress`) and one INFO line per candidate (else DEBUG, no bar).

    Returns:
        The :class:`ValidationOutcome` (``chosen = ()`` keeps dense).

    Raises:
        ValueError: ``k < 1``.
        EvaluatorError: The evaluator gives no per-prompt values, or a different count for
            a candidate than for dense.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is invalid; expected the number of candidates to check (>= 1).")
    describe_evaluator(evaluator)
    calibration: dict[Config, dict[str, Any]] = {}
    if isinstance(result_or_candidates, SearchResult):
        result = result_or_candidates
        candidates = cheapest_feasible(result, k)
        settings = settings or result.settings
        if metric_higher_is_better is None:
            metric_higher_is_better = result.metric_higher_is_better
        for c in candidates:
            r = result.record(c)
            calibration[c] = {
                **r.objectives(),
                "feasibility": result.feasibility_rule,
                "bounds": dict(r.bounds),
            }
    else:
        candidates = [frozenset(c) for c in result_or_candidates if frozenset(c)][:k]
    settings = settings or SearchSettings()
    if metric_higher_is_better is None:
        metric_higher_is_better = bool(getattr(evaluator, "metric_higher_is_better", True))

    n_prompts = prompt_count(evaluator)
    with prompt_bar(
        None if n_prompts is None else n_prompts * (len(candidates) + 1), "validation", enabled=show_progress, leave=True
    ):
        outcome = _validate(evaluator, candidates, calibration, settings, metric_higher_is_better, show_progress)
    if storage is not None and isinstance(result_or_candidates, SearchResult):
        store_validation(storage, result_or_candidates.study_name, outcome)
    return outcome


def _validate(
    evaluator: Any,
    candidates: list[Config],
    calibration: Mapping[Config, Mapping[str, Any]],
    settings: SearchSettings,
    metric_higher_is_better: bool,
    show_progress: bool,
) -> ValidationOutcome:
    """Dense, then each candidate on the validation evaluator, judged by the paired rule."""
    level = logging.INFO if show_progress else logging.DEBUG
    dense, _ = measurement_from(evaluator(frozenset()), frozenset())
    if dense.per_prompt is None or dense.per_prompt.n < 2:
        raise EvaluatorError(
            "Validation needs per-prompt values for at least 2 prompts from the validation "
            "evaluator's dense run; got "
            + ("none" if dense.per_prompt is None else f"{dense.per_prompt.n}")
            + ". Return 'per_prompt' (see docs/evaluator.md) and use a validation split of "
            ">= 2 prompts."
        )
    rule = PairedFeasibility.build(dense.per_prompt, settings, metric_higher_is_better=metric_higher_is_better)
    n = dense.per_prompt.n
    checks: list[CandidateCheck] = []
    chosen: tuple[int, ...] = ()
    for c in candidates:
        m, _ = measurement_from(evaluator(frozenset(c)), c)
        got = None if m.per_prompt is None else m.per_prompt.n
        if got != n:
            raise EvaluatorError(
                f"The validation evaluator returned per_prompt of length {got} for skip set "
                f"{list(canonical(c))} but {n} for dense; it must report every prompt, in the "
                "same order, for every skip set."
            )
        verdict = rule.verdict(m)
        checks.append(
            CandidateCheck(
                skip_set=canonical(c),
                calibration=calibration.get(c, {}),
                validation=_figures(m, {k: b.to_dict() for k, b in verdict.bounds.items()}),
                passed=verdict.feasible,
                reason=verdict.reason,
            )
        )
        log.log(
            level, "validation: skip %s %s", list(canonical(c)),
            "passed" if verdict.feasible else f"failed ({verdict.reason})",
        )
        if verdict.feasible and not chosen:
            chosen = canonical(c)
    if chosen:
        reason = "passed validation"
    elif not candidates:
        reason = "dense kept: the search found no feasible skip set to validate"
    else:
        reason = "dense kept: no candidate passed validation (" + "; ".join(
            f"{list(ch.skip_set)}: {ch.reason}" for ch in checks
        ) + ")"
    return ValidationOutcome(
        chosen=chosen,
        reason=reason,
        candidates=tuple(checks),
        dense={**_figures(dense, {}), "n": n},
        confidence=settings.confidence,
        num_prompts=n,
    )


def _figures(m: Measurement, bounds: Mapping[str, Any]) -> dict[str, Any]:
    pp = m.per_prompt
    assert pp is not None
    # The objectives with the per-prompt means (the validation's own prompts).
    means = replace(
        m, accept_length=round(sum(pp.accept_length) / pp.n, 6), metric=round(sum(pp.metric) / pp.n, 6)
    )
    out: dict[str, Any] = dict(means.objectives())
    if bounds:
        out["bounds"] = bounds
    return out


def store_validation(storage: Any, study_name: str, outcome: ValidationOutcome) -> None:
    """Write ``outcome`` as the study's ``validation`` user attribute (read by export)."""
    import optuna

    from tss_opt.storage import open_storage

    if storage is None or isinstance(storage, str):
        storage = open_storage(storage, heartbeat_interval=None, grace_period=None)
    study = optuna.load_study(study_name=study_name, storage=storage)
    study.set_user_attr(VALIDATION_ATTR, outcome.to_dict())
