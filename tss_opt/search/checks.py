"""The validation step of a search command (issue 10), as library code taking typed values.

:func:`check_on_validation` checks the K cheapest feasible candidates of a finished search on
the validation split before the mapping is written, once per study: a worker that finds the
outcome stored reuses it. The command (``tss_opt.cli.search``) only builds the evaluators from
its configuration and prints the line this returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tss_opt.search.validation import VALIDATION_ATTR, store_validation, validate_candidates

if TYPE_CHECKING:
    from tss_opt.search.result import SearchResult

__all__ = ["check_on_validation", "validation_line"]

log = logging.getLogger("tss_opt.cli")


def check_on_validation(
    result: SearchResult,
    storage: Any,
    candidates: int,
    validation_evaluator: Callable[[], Any | None],
    unavailable_reason: Callable[[], str],
) -> str | None:
    """Validate ``result``'s ``candidates`` cheapest feasible sets (and dense) once per study.

    Args:
        result: the finished search.
        storage: the study's Optuna storage (the outcome is stored in the study).
        candidates: ``search.validation_candidates``; below 1 nothing is checked (warned).
        validation_evaluator: builds the validation split's evaluator (called only when there
            is something to check); ``None`` when it cannot be built.
        unavailable_reason: why there is no validation evaluator (called only then).

    Returns:
        The line to print (``validation (stored): ...`` or ``validation (N min): ...``), or
        ``None`` when nothing was checked (the reason is logged).
    """
    import optuna

    if candidates < 1:
        log.warning("validation skipped (search.validation_candidates=%s): the mapping takes S* unchecked", candidates)
        return None
    stored = optuna.load_study(study_name=result.study_name, storage=storage).user_attrs.get(VALIDATION_ATTR)
    if stored is not None:
        return f"validation (stored): {validation_line(stored)}"
    if not result.best and not [c for c in result.pareto if c]:
        log.info("validation: nothing to validate (S* is dense)")
        return None
    ev = validation_evaluator()
    if ev is None:
        log.warning("validation skipped: %s; the mapping takes S* unchecked", unavailable_reason())
        return None
    t0 = time.perf_counter()
    log.info(
        "validation: the %d cheapest feasible candidates and dense on %d validation prompts",
        candidates, ev.num_prompts if hasattr(ev, "num_prompts") else -1,
    )
    outcome = validate_candidates(result, ev, candidates)
    store_validation(storage, result.study_name, outcome)
    return f"validation ({(time.perf_counter() - t0) / 60:.1f} min): {validation_line(outcome.to_dict())}"


def validation_line(v: dict[str, Any]) -> str:
    """One line for a stored validation outcome: the chosen set (or dense and why), and each
    checked candidate's pass or fail."""
    chosen = v.get("chosen") or []
    checked = ", ".join(
        f"{c.get('skip_set')}: {'pass' if c.get('passed') else 'fail'}" for c in v.get("candidates", [])
    )
    head = f"dense kept ({v.get('reason')})" if not chosen else f"chosen {chosen}"
    return f"{head}; checked {checked or 'none'}"
