"""SQuAD-style answer metrics: token F1 and exact match after answer normalisation."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from ._registry import Metric, register_metric

__all__ = ["EXACT_MATCH", "TOKEN_F1", "exact_match", "normalize_answer", "token_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop ASCII punctuation, drop a/an/the, collapse spaces.

    The order follows the official SQuAD v1.1/v2.0 evaluation script, so "The-Beatles" becomes
    "thebeatles" (punctuation is removed, not replaced by a space).
    """
    text = text.lower().translate(_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1(prediction: str, reference: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    ref_tokens = normalize_answer(reference).split()
    if not pred_tokens or not ref_tokens:
        # SQuAD v2.0 convention: two empty answers agree; one empty answer scores 0.
        return float(pred_tokens == ref_tokens)
    common = Counter(pred_tokens) & Counter(ref_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references: Sequence[str]) -> float:
    """Token-level F1 of the normalised prediction, best over the references."""
    return max(_f1(prediction, ref) for ref in references)


def exact_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised reference, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(ref) for ref in references))


TOKEN_F1 = register_metric(
    Metric(
        "token_f1",
        token_f1,
        higher_is_better=True,
        description="SQuAD token F1 after answer normalisation, best over references",
    )
)
EXACT_MATCH = register_metric(
    Metric(
        "exact_match",
        exact_match,
        higher_is_better=True,
        description="SQuAD exact match after answer normalisation, best over references",
    )
)
