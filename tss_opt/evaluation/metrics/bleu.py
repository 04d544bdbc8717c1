"""BLEU through sacrebleu, on the 0-1 scale the TSS authors report."""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu

from ._registry import Metric, register_metric

__all__ = ["BLEU", "corpus_bleu", "sentence_bleu"]


def sentence_bleu(prediction: str, references: Sequence[str]) -> float:
    """sacrebleu's smoothed sentence BLEU (default 13a tokenisation, exp smoothing) / 100."""
    return sacrebleu.sentence_bleu(prediction, list(references)).score / 100.0


def corpus_bleu(
    predictions: Sequence[str], references: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Corpus BLEU / 100 over all examples; examples may have different numbers of references."""
    width = max(len(refs) for refs in references)
    # sacrebleu wants reference *streams* (one per reference slot); pad short lists with None,
    # which sacrebleu skips, so examples with fewer references still count.
    streams = [[refs[k] if k < len(refs) else None for refs in references] for k in range(width)]
    return {"corpus_bleu": sacrebleu.corpus_bleu(list(predictions), streams).score / 100.0}


BLEU = register_metric(
    Metric(
        "bleu",
        sentence_bleu,
        higher_is_better=True,
        extras=corpus_bleu,
        description="mean sacrebleu sentence BLEU / 100; extras: corpus_bleu",
    )
)
