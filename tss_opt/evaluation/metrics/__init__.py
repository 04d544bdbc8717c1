"""Task metrics by name: ``get_metric("rouge_l").score(predictions, references)``.

Built-in metrics (all higher-is-better): ``bleu``, ``rouge_l``, ``token_f1``, ``exact_match``,
``mmlu_accuracy``, ``numeric_match`` (all need references) and ``non_repetition`` (reference-free:
1 - share of repeated word trigrams). Add one with :func:`register_metric`.
"""

from __future__ import annotations

from . import bleu, choice, numeric, rouge, token_f1  # noqa: F401  (importing registers the metrics)
from ._registry import (
    Metric,
    MetricResult,
    UnknownMetricError,
    available_metrics,
    get_metric,
    register_metric,
)
from .choice import extract_choice_letter
from .token_f1 import normalize_answer

__all__ = [
    "Metric",
    "MetricResult",
    "UnknownMetricError",
    "available_metrics",
    "extract_choice_letter",
    "get_metric",
    "normalize_answer",
    "register_metric",
]
