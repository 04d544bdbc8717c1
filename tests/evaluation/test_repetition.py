"""The repetition score: share of repeated 4-grams, exact values on hand-made outputs."""

from __future__ import annotations

import pytest

from tss_opt.evaluation.metrics.repetition import repeated_ngram_share


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([], 0.0),
        ([5, 5, 5, 5], 0.0),  # shorter than 5 tokens
        ([1, 2, 3, 4, 5, 6, 7, 8], 0.0),  # 5 windows, all distinct
        ([1, 2, 3, 4, 1, 2, 3, 4], 1 / 5),  # 5 windows, 4 distinct
        ([7] * 10, 6 / 7),  # 7 windows, 1 distinct
        ([7] * 5, 1 / 2),  # 2 windows, 1 distinct
        ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4], 5 / 9),  # 9 windows, 4 distinct
        ([1, 2, 1, 2, 1, 2, 9], 1 / 4),  # windows 1212, 2121, 1212, 2129: 3 distinct of 4
    ],
)
def test_exact_values(tokens, expected):
    assert repeated_ngram_share(tokens) == pytest.approx(expected)


def test_other_n_and_bad_n():
    assert repeated_ngram_share([1, 1, 2, 2], n=1) == pytest.approx(1 - 2 / 4)
    assert repeated_ngram_share((3, 4, 3, 4, 3), n=2) == pytest.approx(1 - 2 / 4)
    with pytest.raises(ValueError, match="n=0"):
        repeated_ngram_share([1, 2, 3], n=0)
