"""Multiple-choice accuracy (MMLU): find the chosen letter in free-form model output.

Chat models rarely answer with a bare letter, so :func:`extract_choice_letter` looks for it in
three passes, first hit wins:

1. an explicit cue anywhere: "answer", "option" or "choice", optionally followed by "is" or a
   colon, then a letter: "The answer is (B)", "Answer: B. Paris", "correct option: c)";
2. a letter at the very start: "B", "(B)", "B.", "B) Paris", "b)", "**B**";
3. the first line that holds a standalone letter: "(B)", "B.", "B)", or a capital B/C/D
   standing alone ("I think C is right"). A capital "A" followed by a lower-case word is read
   as the article ("A lesion causes ...") and skipped.

Markdown emphasis (``*``, ``_``, backticks) is removed first. A lower-case letter counts only
when bracketed or followed by ``)``, ``.`` or ``:`` (or ends the text after a cue), so words
like "a" are not mistaken for choices. Choice texts are not matched (a metric sees only the
prediction and the reference letter): an answer that names the choice without its letter
scores 0. No letter found scores 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from ._registry import Metric, register_metric

__all__ = ["MMLU_ACCURACY", "choice_accuracy", "extract_choice_letter"]

_MARKDOWN = str.maketrans("", "", "*_`")


@lru_cache(maxsize=8)
def _patterns(letters: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    up = re.escape(letters.upper())
    low = re.escape(letters.lower())
    # A letter as a choice label: bracketed (any case); capital not glued to a word; lower-case
    # only with a closing delimiter (or at the end of the text).
    label = (
        rf"[\(\[]\s*(?P<b>[{up}{low}])\s*[\)\]]"
        rf"|(?P<u>[{up}])(?![\w'’\-]|\.\w)"
        rf"|(?P<l>[{low}])(?=[\).:]|\s*$)"
    )
    cue = re.compile(
        rf"(?i:\b(?:answer|option|choice))(?:\s+(?i:is|would\s+be))?\s*:?\s*"
        rf"(?:(?i:option|choice)\s+)?(?:{label})"
    )
    start = re.compile(
        rf"^\s*(?:[\(\[]\s*(?P<b>[{up}{low}])\s*[\)\]]|(?P<d>[{up}{low}])(?:[\).:,]|\s*$))"
    )
    # Anywhere in a line: bracketed, letter + delimiter, or a standalone capital (not the
    # article "A word").
    loose = re.compile(
        rf"[\(\[]\s*(?P<b>[{up}{low}])\s*[\)\]]"
        rf"|(?<![\w'’.])(?P<d>[{up}])[\).:](?=\s|$)"
        rf"|(?<![\w'’])(?P<l>[{low}])\)"
        rf"|(?<![\w'’.\-])(?P<u>[{up}])(?![\w'’\-]|\.\w)"
    )
    return cue, start, loose


def _letter(match: re.Match[str] | None, letters: str) -> str | None:
    if match is None:
        return None
    for value in match.groupdict().values():
        if value:
            return value.upper()
    return None


def extract_choice_letter(text: str, letters: str = "ABCD") -> str | None:
    """Returns the choice letter a free-text answer picks, upper-case, or None if none is found.

    Args:
        text: The model's answer.
        letters: The valid choice letters, in order (MMLU: ``"ABCD"``).
    """
    cue, start, loose = _patterns(letters)
    text = text.translate(_MARKDOWN).strip()
    found = _letter(cue.search(text), letters) or _letter(start.match(text), letters)
    if found:
        return found
    for line in text.splitlines():
        for match in loose.finditer(line):
            if match.group("u") == "A" and re.match(r"\s+[a-z]", line[match.end() :]):
                continue  # "A lesion ...": the article, not choice A
            return _letter(match, letters)
    return None


def choice_accuracy(prediction: str, references: Sequence[str]) -> float:
    """1.0 when the extracted letter equals any reference letter (case-insensitive), else 0.0."""
    letter = extract_choice_letter(prediction)
    return float(letter is not None and letter in {ref.strip().upper() for ref in references})


MMLU_ACCURACY = register_metric(
    Metric(
        "mmlu_accuracy",
        choice_accuracy,
        higher_is_better=True,
        description="multiple-choice accuracy on the letter extracted from the answer",
    )
)
