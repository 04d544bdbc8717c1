"""The evaluator contract: what a trial calls, and how its answer is checked and stored."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from tss_opt.config.objectives import (
    ACCEPT_LENGTH,
    COST,
    METRIC,
    OBJECTIVE_NAMES,
    PAIRED_OBJECTIVES,
)
from tss_opt.errors import TSSError
from tss_opt.search.algorithm import Measurement
from tss_opt.search.feasibility import PER_PROMPT_DECIMALS, PerPrompt

__all__ = [
    "PER_PROMPT_KEYS",
    "Evaluator",
    "EvaluatorError",
    "EvaluatorInfo",
    "describe_evaluator",
    "measurement_from",
    "per_prompt_from",
    "prompt_count",
    "to_json",
]

# Keys of one per-prompt entry: required (the paired objectives), then optional.
PER_PROMPT_KEYS = (*PAIRED_OBJECTIVES, "tokens", "repetition")


@runtime_checkable
class Evaluator(Protocol):
    """Anything with ``num_layers`` that measures a skip set.

    Called with a ``frozenset[int]`` of layer indices in ``[0, num_layers)``, it returns a
    mapping with at least ``accept_length`` (float, higher is better), ``metric`` (float) and
    ``cost`` (float, lower is better). Other keys (``tokens_per_s``, ``cost_analytic``,
    ``cost_measured``, nested dicts of per-metric details...) are stored as trial user
    attributes. Optional attributes: ``metric_name`` (default ``"metric"``) and
    ``metric_higher_is_better`` (default ``True``), which set the study's directions.

    Optional ``per_prompt`` key: a list with one mapping per prompt, in the same
    prompt order for every skip set, each with ``accept_length`` and ``metric`` (floats) and
    optionally ``tokens`` (generated tokens) and ``repetition`` (share of repeated 4-grams in
    the output, 0..1). It enables the paired feasibility rule.

    Optional early-stopping support: an ``num_prompts`` attribute (int) and a keyword
    ``prompt_ids`` (list of prompt indices in ``[0, num_prompts)``): ``evaluator(skip,
    prompt_ids=[...])`` evaluates only those prompts and returns their ``per_prompt`` (in
    that order) plus the aggregates over them.
    """

    num_layers: int

    def __call__(self, skip: frozenset[int]) -> Mapping[str, Any]: ...


class EvaluatorError(TSSError):
    """The evaluator is malformed or returned something unusable."""


class EvaluatorInfo:
    """The evaluator's static description, checked once."""

    def __init__(self, num_layers: int, metric_name: str, metric_higher_is_better: bool) -> None:
        self.num_layers = num_layers
        self.metric_name = metric_name
        self.metric_higher_is_better = metric_higher_is_better


def describe_evaluator(evaluator: Any) -> EvaluatorInfo:
    """Read and check ``num_layers``, ``metric_name`` and ``metric_higher_is_better``.

    Raises:
        EvaluatorError: An attribute is missing or of the wrong type.
    """
    if not callable(evaluator):
        raise EvaluatorError(
            f"The evaluator {type(evaluator).__name__} is not callable; it must be called with "
            "a frozenset of layer indices and return a mapping (see tss_opt.search.Evaluator)."
        )
    num_layers = getattr(evaluator, "num_layers", None)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise EvaluatorError(
            f"evaluator.num_layers={num_layers!r} is invalid; expected the target's decoder "
            "layer count (an integer >= 1)."
        )
    metric_name = getattr(evaluator, "metric_name", "metric")
    if not isinstance(metric_name, str) or not metric_name:
        raise EvaluatorError(f"evaluator.metric_name={metric_name!r} must be a non-empty string.")
    if metric_name in (ACCEPT_LENGTH, COST):
        raise EvaluatorError(
            f"evaluator.metric_name={metric_name!r} clashes with an objective name; "
            "use the task metric's own name (e.g. 'bleu', 'rouge_l', 'f1', 'accuracy')."
        )
    higher = getattr(evaluator, "metric_higher_is_better", True)
    if not isinstance(higher, bool):
        raise EvaluatorError(f"evaluator.metric_higher_is_better={higher!r} must be a bool.")
    return EvaluatorInfo(num_layers, metric_name, higher)


def measurement_from(result: Any, skip: frozenset[int]) -> tuple[Measurement, dict[str, Any]]:
    """Check an evaluator's answer; return the measurement and the JSON-safe extras.

    Raises:
        EvaluatorError: Not a mapping, a required key missing, or a value not a finite number.
    """
    shown = sorted(skip)
    if not isinstance(result, Mapping):
        raise EvaluatorError(
            f"The evaluator returned {type(result).__name__} for skip set {shown}; expected a "
            f"mapping with keys {', '.join(OBJECTIVE_NAMES)}."
        )
    values: dict[str, float] = {}
    for key in OBJECTIVE_NAMES:
        if key not in result:
            raise EvaluatorError(
                f"The evaluator's result for skip set {shown} lacks '{key}' (got keys "
                f"{sorted(map(str, result))}); expected {', '.join(OBJECTIVE_NAMES)}."
            )
        values[key] = _finite(result[key], key, shown)
    tps = result.get("tokens_per_s")
    tokens_per_s = None if tps is None else _finite(tps, "tokens_per_s", shown)
    per_prompt = per_prompt_from(result.get("per_prompt"), shown)
    extras = {
        str(k): to_json(v) for k, v in result.items() if k not in OBJECTIVE_NAMES and k != "per_prompt"
    }
    return Measurement(tokens_per_s=tokens_per_s, per_prompt=per_prompt, **values), extras


def per_prompt_from(value: Any, shown: list[int]) -> PerPrompt | None:
    """Check an evaluator's ``per_prompt`` list; return it rounded as it is stored.

    Values are rounded to 4 decimals, the form stored in the trial's ``per_prompt`` user
    attribute, so decisions made now and replays from the storage see the same numbers.

    Raises:
        EvaluatorError: Not a list of mappings, a required key missing, a value not finite,
            or an optional key present for some prompts only.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise EvaluatorError(
            f"'per_prompt' for skip set {shown} is a {type(value).__name__}; expected a list "
            "with one mapping per prompt (keys accept_length, metric[, tokens, repetition])."
        )
    rows = list(value)
    cols: dict[str, list[float]] = {k: [] for k in PER_PROMPT_KEYS}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise EvaluatorError(
                f"per_prompt[{i}] for skip set {shown} is a {type(row).__name__}; expected a "
                "mapping with accept_length and metric."
            )
        for key in PER_PROMPT_KEYS:
            if key in row and row[key] is not None:
                x = _finite(row[key], f"per_prompt[{i}].{key}", shown)
                cols[key].append(round(x, PER_PROMPT_DECIMALS))
            elif key in PAIRED_OBJECTIVES:
                raise EvaluatorError(
                    f"per_prompt[{i}] for skip set {shown} lacks '{key}' (got keys "
                    f"{sorted(map(str, row))}); every entry needs accept_length and metric."
                )
    for key in ("tokens", "repetition"):
        if 0 < len(cols[key]) < len(rows):
            raise EvaluatorError(
                f"per_prompt for skip set {shown} has '{key}' for {len(cols[key])} of "
                f"{len(rows)} prompts; report it for every prompt or for none."
            )
    return PerPrompt(
        accept_length=tuple(cols[ACCEPT_LENGTH]),
        metric=tuple(cols[METRIC]),
        tokens=tuple(cols["tokens"]) if cols["tokens"] else None,
        repetition=tuple(cols["repetition"]) if cols["repetition"] else None,
    )


def prompt_count(evaluator: Any) -> int | None:
    """The evaluator's ``num_prompts`` when it supports ``prompt_ids=`` (early stopping)."""
    n = getattr(evaluator, "num_prompts", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    return n


def _finite(value: Any, key: str, shown: list[int]) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as e:
        raise EvaluatorError(f"'{key}'={value!r} for skip set {shown} is not a number.") from e
    if not math.isfinite(number):
        raise EvaluatorError(
            f"'{key}'={number} for skip set {shown} is not finite; the evaluator must return "
            "finite values (check for an empty calibration set or a division by zero)."
        )
    return number


def to_json(value: Any) -> Any:
    """Convert ``value`` into JSON-serialisable data (numpy/torch scalars and arrays, sets...)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [to_json(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    # numpy and torch scalars / arrays, without importing either.
    if hasattr(value, "tolist"):
        return to_json(value.tolist())
    if hasattr(value, "item"):
        return to_json(value.item())
    if isinstance(value, (int, float)):
        return float(value)
    return str(value)
