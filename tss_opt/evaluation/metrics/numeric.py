"""Answers that are numbers (GSM8K-style), and a reference-free score for data without answers.

``numeric_match`` reads the *last* number in the output, as lm-evaluation-harness's GSM8K
"flexible-extract" filter does: chat models state the result after their reasoning. Thousands
separators are removed first ("1,234" is 1234), so the comparison is on numbers, not strings
("42.0" equals "42"). A reference is read the same way (its last number), so a domain whose
references still carry text around the number works; GSM8K's "... #### 42" is better cut with
the domain's ``reference_pattern`` (docs/domains.md).

``non_repetition`` needs no reference: 1 minus the share of repeated word trigrams in the
output. Layer skipping that breaks a model shows first as loops ("the the the", a sentence
said over and over); fluent text scores close to 1. Higher is better, range [0, 1]; an empty
output scores 0 (nothing was produced).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from ._registry import Metric, register_metric

__all__ = ["NON_REPETITION", "NUMERIC_MATCH", "last_number", "non_repetition", "numeric_match"]

# A number as written in answers: optional sign, digits with optional thousands commas, an
# optional decimal part ("-1,234.5", "42", ".5" is not matched: answers write "0.5").
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_TOLERANCE = 1e-6


def last_number(text: str) -> float | None:
    """The last number in ``text`` (commas removed), or ``None`` when it holds none."""
    for raw in reversed(_NUMBER.findall(text)):
        try:
            return float(raw.replace(",", ""))
        except ValueError:  # "1,,"-like leftovers: try the one before
            continue
    return None


def numeric_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 when the last number of the prediction equals the last number of any reference."""
    got = last_number(prediction)
    if got is None:
        return 0.0
    for ref in references:
        want = last_number(ref)
        if want is not None and math.isclose(got, want, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE):
            return 1.0
    return 0.0


def non_repetition(prediction: str, references: Sequence[str] = ()) -> float:
    """1 - repeated word trigrams / word trigrams of the prediction (references ignored).

    Outputs shorter than three words count their repeated words instead (a one-word output
    scores 1, an empty one 0).
    """
    words = prediction.lower().split()
    if not words:
        return 0.0
    n = 3 if len(words) >= 3 else 1
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams)


NUMERIC_MATCH = register_metric(
    Metric(
        "numeric_match",
        numeric_match,
        higher_is_better=True,
        description="the last number of the output (commas removed) equals the reference's number",
    )
)
NON_REPETITION = register_metric(
    Metric(
        "non_repetition",
        non_repetition,
        higher_is_better=True,
        needs_references=False,
        description="reference-free: 1 - share of repeated word trigrams (1 = no loops, 0 = empty)",
    )
)
