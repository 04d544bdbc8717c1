"""The metrics registry and each built-in metric against hand-computed values."""

from __future__ import annotations

import pytest

from tss_opt.evaluation.metrics import (
    Metric,
    MetricResult,
    UnknownMetricError,
    _registry,
    available_metrics,
    extract_choice_letter,
    get_metric,
    normalize_answer,
    register_metric,
)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    # Metrics registered by a test must not leak into other tests.
    monkeypatch.setattr(_registry, "_REGISTRY", dict(_registry._REGISTRY))


def score(name: str, predictions: list[str], references: list[list[str]]) -> MetricResult:
    return get_metric(name).score(predictions, references)


# --- registry ---------------------------------------------------------------------------------


def test_available_metrics_and_directions() -> None:
    assert available_metrics() == ["bleu", "exact_match", "mmlu_accuracy", "non_repetition", "numeric_match", "rouge_l", "token_f1"]
    for name in available_metrics():
        metric = get_metric(name)
        assert metric.name == name
        assert metric.higher_is_better is True
        assert metric.needs_references is (name != "non_repetition")


def test_unknown_metric_suggests_and_lists() -> None:
    with pytest.raises(UnknownMetricError) as info:
        get_metric("rouge")
    message = str(info.value)
    assert "Unknown metric 'rouge'" in message
    assert "Did you mean 'rouge_l'?" in message
    assert "bleu, exact_match, mmlu_accuracy, non_repetition, numeric_match, rouge_l, token_f1" in message
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_unknown_metric_without_close_match() -> None:
    with pytest.raises(ValueError, match="Available: bleu") as info:
        get_metric("zzzzzz")
    assert "Did you mean" not in str(info.value)


def test_register_custom_metric(clean_registry: None) -> None:
    length = register_metric(
        Metric(
            "length",
            lambda p, r: float(len(p.split())),
            higher_is_better=False,
            needs_references=False,
        )
    )
    assert get_metric("length") is length
    assert "length" in available_metrics()
    result = length.score(["a b c", "d"], [[], []])
    assert result == MetricResult(value=2.0, per_example=[3.0, 1.0], extras={})
    with pytest.raises(ValueError, match="already registered"):
        register_metric(Metric("length", lambda p, r: 0.0))
    replaced = register_metric(Metric("length", lambda p, r: 0.0), replace=True)
    assert get_metric("length") is replaced


@pytest.mark.parametrize(
    ("predictions", "references", "match"),
    [
        (["a", "b"], [["a"]], "2 predictions but 1 reference lists"),
        ([], [], "0 predictions"),
        ("a", [["a"]], "bare string"),
        (["a"], [[]], "needs references, but example 0 has none"),
        ([1], [["a"]], "prediction 0 is int"),
    ],
)
def test_score_rejects_bad_input(predictions: list, references: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_metric("token_f1").score(predictions, references)


# --- BLEU -------------------------------------------------------------------------------------


def test_bleu_hand_computed() -> None:
    # Precisions 5/6, 3/5, 2/4, 1/3, equal lengths (BP = 1): BLEU = (5/6*3/5*1/2*1/3) ** (1/4).
    partial = (5 / 6 * 3 / 5 * 1 / 2 * 1 / 3) ** 0.25
    result = score(
        "bleu",
        ["the cat sat on the mat", "hello there general kenobi"],
        [["the cat sat on a mat"], ["hello there general kenobi"]],
    )
    assert result.per_example == pytest.approx([partial, 1.0])
    assert result.value == pytest.approx((partial + 1.0) / 2)
    # Corpus counts: 9/10, 6/8, 4/6, 2/4.
    assert result.extras["corpus_bleu"] == pytest.approx((0.9 * 0.75 * 4 / 6 * 0.5) ** 0.25)


def test_bleu_several_references_and_empty_prediction() -> None:
    result = score(
        "bleu",
        ["the cat sat on the mat", ""],
        [["a dog ran off", "the cat sat on the mat"], ["the cat sat on the mat"]],
    )
    assert result.per_example == pytest.approx([1.0, 0.0])
    assert 0.0 <= result.extras["corpus_bleu"] <= 1.0


# --- ROUGE-L ----------------------------------------------------------------------------------


def test_rouge_l_hand_computed() -> None:
    # LCS "the cat on the mat" = 5 of 6 tokens on both sides: P = R = F = 5/6.
    result = score("rouge_l", ["The cat sat on the mat."], [["the cat was on the mat"]])
    assert result.value == pytest.approx(5 / 6)


def test_rouge_l_best_reference_and_stemming() -> None:
    result = score(
        "rouge_l",
        ["cats running", "completely different"],
        [["dogs sleeping", "cat run"], ["the cat sat"]],
    )
    assert result.per_example == pytest.approx([1.0, 0.0])  # Porter: cats->cat, running->run
    assert result.value == pytest.approx(0.5)


# --- SQuAD normalisation, token F1, exact match -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel  Tower!", "eiffel tower"),
        ("an apple a day", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre, Anthem", "theatre anthem"),  # articles only as whole words
        ("  \n", ""),
        ("the", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_token_f1_hand_computed() -> None:
    result = score(
        "token_f1",
        ["The Eiffel Tower, Paris!", "x x y", "an apple", ""],
        [["eiffel tower"], ["x y y"], ["the apple"], ["paris"]],
    )
    # 2 of 3 tokens match 2 of 2 -> P 2/3, R 1 -> F1 0.8; "x x y" vs "x y y": overlap 2 -> 2/3.
    assert result.per_example == pytest.approx([0.8, 2 / 3, 1.0, 0.0])
    assert result.value == pytest.approx((0.8 + 2 / 3 + 1.0) / 4)


def test_token_f1_best_of_several_references_and_empty_cases() -> None:
    result = score(
        "token_f1",
        ["George Washington", "", "the"],
        [["john adams", "washington", "George Washington Carver"], ["the"], ["paris"]],
    )
    # max(0, F1(2 vs 1 token) = 2/3, F1(2 vs 3) = 0.8) = 0.8; both empty after normalisation -> 1;
    # prediction empty after normalisation, reference not -> 0.
    assert result.per_example == pytest.approx([0.8, 1.0, 0.0])


def test_exact_match() -> None:
    result = score(
        "exact_match",
        ["The  Beatles.", "Beatles band", "usa", ""],
        [["beatles"], ["beatles"], ["canada", "U.S.A."], ["x"]],
    )
    assert result.per_example == [1.0, 0.0, 1.0, 0.0]
    assert result.value == pytest.approx(0.5)


# --- multiple choice ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B", "B"),
        ("(B)", "B"),
        ("The answer is (B)", "B"),
        ("The answer is (B).", "B"),
        ("Answer: B. Paris", "B"),
        ("**B**", "B"),
        ("**Answer:** C", "C"),
        ("b)", "B"),
        ("B) Paris is the capital", "B"),
        ("d.", "D"),
        ("  C\nbecause ...", "C"),
        ("The correct option is c.", "C"),
        ("answer is d", "D"),
        ("Final answer: [A]", "A"),
        ("I think C is right.", "C"),
        ("A lesion of the nerve causes this.\nSo the answer must be D.", "D"),
        ("Let me think.\nOption B looks right; A does not.", "B"),
        ("A", "A"),
        ("A.", "A"),
        ("Washington D.C. is the capital (B)", "B"),
        ("Paris", None),
        ("The answer is a good question", None),
        ("Answer: Dopamine", None),
        ("", None),
    ],
)
def test_extract_choice_letter(text: str, letter: str | None) -> None:
    assert extract_choice_letter(text) == letter


def test_mmlu_accuracy() -> None:
    result = score(
        "mmlu_accuracy",
        ["B", "The answer is (C)", "no idea", "d) Lumbar"],
        [["B"], ["D"], ["A"], ["d"]],
    )
    assert result.per_example == [1.0, 0.0, 0.0, 1.0]
    assert result.value == pytest.approx(0.5)


# --- numeric_match and the reference-free non_repetition -----------------------------------------


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ("So she pays 3 * 4 = 12 dollars. The answer is 12.", "12", 1.0),
        ("The total is 1,234,567", "1234567", 1.0),
        ("It is 42.0", "42", 1.0),
        ("-3 degrees", "-3", 1.0),
        ("First 12, then 13", "12", 0.0),  # the last number counts
        ("no number here", "12", 0.0),
        ("7", "#### 7", 1.0),  # a reference's last number is read the same way
    ],
)
def test_numeric_match(prediction: str, reference: str, expected: float) -> None:
    from tss_opt.evaluation.metrics import get_metric

    assert get_metric("numeric_match").score([prediction], [[reference]]).value == expected


def test_non_repetition_is_reference_free_and_punishes_loops() -> None:
    from tss_opt.evaluation.metrics import get_metric

    m = get_metric("non_repetition")
    assert m.higher_is_better and not m.needs_references
    res = m.score(["a fluent sentence with no loops at all", "the cat the cat the cat the cat", ""], [[], [], []])
    assert res.per_example[0] == 1.0
    assert res.per_example[1] < 0.5
    assert res.per_example[2] == 0.0
