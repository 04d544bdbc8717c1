"""ROUGE-L F1 through Google's rouge-score package."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from rouge_score import rouge_scorer

from ._registry import Metric, register_metric

__all__ = ["ROUGE_L", "rouge_l"]


@lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
    # Built once: the Porter stemmer setup is the costly part.
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-L F1 (sentence-level LCS, Porter stemming), best over the references."""
    scorer = _scorer()
    return max(scorer.score(ref, prediction)["rougeL"].fmeasure for ref in references)


ROUGE_L = register_metric(
    Metric(
        "rouge_l",
        rouge_l,
        higher_is_better=True,
        description="ROUGE-L F1 with stemming, best over references, mean over examples",
    )
)
