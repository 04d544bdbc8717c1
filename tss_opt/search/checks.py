"""The validation step of a search command, as library code taking typed values.

The K cheapest feasible candidates of a finished search are checked on the validation split
before the mapping is written, once per study: a worker that finds the outcome stored reuses
it. Two steps, called in order by the command (``tss_opt.cli.search``), which builds the
validation evaluator in between and prints the line:

1. :func:`decide_validation`: skipped (``search.validation_candidates`` below 1), already
   stored, nothing to validate (S* is dense), or needed.
2. :func:`run_validation`, only when needed: evaluates the candidates and stores the outcome.

Nothing here calls back into the command or the assembly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tss_opt.search.validation import VALIDATION_ATTR, store_validation, validate_candidates

if TYPE_CHECKING:
    from tss_opt.search.result import SearchResult

__all__ = ["ValidationDecision", "decide_validation", "run_validation", "validation_line"]

log = logging.getLogger("tss_opt.search")


@dataclass(frozen=True)
class ValidationDecision:
    """What the validation step does for one finished search.

    Attributes:
        needed: The candidates must be evaluated: build the validation evaluator and call
            :func:`run_validation`.
        line: The line to print when decided without evaluating (``validation (stored):
            ...``), else ``None`` (skipped or nothing to validate: the reason is logged).
    """

    needed: bool
    line: str | None = None


def decide_validation(result: SearchResult, storage: Any, candidates: int) -> ValidationDecision:
    """Decide whether ``result``'s ``candidates`` cheapest feasible sets must be validated.

    Args:
        result: the finished search.
        storage: the study's Optuna storage (a stored outcome is reused).
        candidates: ``search.validation_candidates``; below 1 nothing is checked (warned).
    """
    import optuna

    if candidates < 1:
        log.warning("validation skipped (search.validation_candidates=%s): the mapping takes S* unchecked", candidates)
        return ValidationDecision(needed=False)
    stored = optuna.load_study(study_name=result.study_name, storage=storage).user_attrs.get(VALIDATION_ATTR)
    if stored is not None:
        return ValidationDecision(needed=False, line=f"validation (stored): {validation_line(stored)}")
    if not result.best and not [c for c in result.pareto if c]:
        log.info("validation: nothing to validate (S* is dense)")
        return ValidationDecision(needed=False)
    return ValidationDecision(needed=True)


def run_validation(
    result: SearchResult, storage: Any, candidates: int, evaluator: Any | None, unavailable: str = ""
) -> str | None:
    """Validate ``result``'s ``candidates`` cheapest feasible sets (and dense) on
    ``evaluator`` and store the outcome in the study (after :func:`decide_validation` said
    it is needed).

    Args:
        result: the finished search.
        storage: the study's Optuna storage (the outcome is stored in the study).
        candidates: ``search.validation_candidates`` (at least 1).
        evaluator: the validation split's evaluator; ``None`` when it cannot be built.
        unavailable: why there is no validation evaluator (logged when ``evaluator`` is None).

    Returns:
        The line to print (``validation (N min): ...``), or ``None`` when there was no
        evaluator (the reason is logged).
    """
    if evaluator is None:
        log.warning("validation skipped: %s; the mapping takes S* unchecked", unavailable)
        return None
    t0 = time.perf_counter()
    log.info(
        "validation: the %d cheapest feasible candidates and dense on %d validation prompts",
        candidates, evaluator.num_prompts if hasattr(evaluator, "num_prompts") else -1,
    )
    outcome = validate_candidates(result, evaluator, candidates)
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
