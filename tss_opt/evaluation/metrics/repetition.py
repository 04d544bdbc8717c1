"""How much an output repeats itself: a degeneration signal computed on token ids.

Not a registered task metric (it needs no references and is not a search objective): the
evaluator reports it per prompt so that feasibility can flag skip sets whose outputs loop.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAM = 4


def repeated_ngram_share(tokens: Sequence[int], n: int = NGRAM) -> float:
    """Share of an output's n-grams (default 4-grams) that repeat an earlier one.

    With ``L`` tokens there are ``L - n + 1`` n-grams (overlapping windows, counted with
    multiplicity); the score is ``1 - distinct / total``, i.e. the fraction of windows whose
    n-gram already occurred earlier in the same output (Welleck et al. 2020's "seq-rep-n").
    0.0 means no n-gram occurs twice; a single token repeated gives ``(L - n) / (L - n + 1)``,
    close to 1. Outputs shorter than ``n + 1`` tokens score 0.0.

    Examples (n = 4): ``[1, 2, 3, 4, 1, 2, 3, 4]`` has 5 windows, 4 distinct -> 0.2;
    ``[7] * 10`` has 7 windows, 1 distinct -> 6/7.

    Args:
        tokens: The generated token ids (prompt excluded), in order.
        n: The n-gram length (>= 1).

    Returns:
        A float in ``[0, 1)``.
    """
    if n < 1:
        raise ValueError(f"n={n}; expected an n-gram length >= 1")
    toks = [int(t) for t in tokens]
    if len(toks) < n + 1:
        return 0.0
    grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)
