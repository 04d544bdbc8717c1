"""MemoEvaluator: studies of one compare/sweep run share measurements, budgets unchanged."""

from __future__ import annotations

import optuna
import pytest

from tss_opt.search import run_search
from tss_opt.search.memo import MemoEvaluator, memoizable


class Counting:
    """A deterministic evaluator that counts what it really measures."""

    num_layers = 6
    num_prompts = 4
    metric_name = "score"
    temperature = 0.0

    def __init__(self) -> None:
        self.calls: list[tuple[frozenset[int], tuple[int, ...] | None]] = []

    def __call__(self, skip, prompt_ids=None):
        self.calls.append((frozenset(skip), None if prompt_ids is None else tuple(prompt_ids)))
        ids = range(self.num_prompts) if prompt_ids is None else prompt_ids
        per = [{"accept_length": 2.0 - 0.1 * len(skip) + 0.01 * i, "metric": 0.5 - 0.01 * len(skip)} for i in ids]
        return {
            "accept_length": sum(p["accept_length"] for p in per) / len(per),
            "metric": sum(p["metric"] for p in per) / len(per),
            "cost": 1.0 - 0.1 * len(skip),
            "per_prompt": per,
        }


def test_repeated_request_is_answered_from_memory() -> None:
    inner = Counting()
    memo = MemoEvaluator(inner)
    a = memo(frozenset({1, 2}))
    b = memo(frozenset({2, 1}))
    c = memo(frozenset({1, 2}), prompt_ids=[0, 1])
    assert a == b and c["per_prompt"] != a["per_prompt"]
    assert (memo.hits, memo.misses) == (1, 2)
    assert inner.calls == [(frozenset({1, 2}), None), (frozenset({1, 2}), (0, 1))]
    a["per_prompt"].clear()  # a caller's edit must not reach the memory
    assert len(memo(frozenset({1, 2}))["per_prompt"]) == 4


def test_attributes_come_from_the_evaluator() -> None:
    memo = MemoEvaluator(Counting())
    assert (memo.num_layers, memo.num_prompts, memo.metric_name) == (6, 4, "score")
    with pytest.raises(AttributeError):
        memo.no_such_attribute  # noqa: B018


def test_only_deterministic_evaluators_are_memoizable() -> None:
    assert memoizable(Counting())
    sampling = Counting()
    sampling.temperature = 0.7
    assert not memoizable(sampling)
    assert not memoizable(object())


def test_two_studies_share_measurements_and_keep_their_budgets(tmp_path) -> None:
    inner = Counting()
    memo = MemoEvaluator(inner)
    storage = f"sqlite:///{tmp_path}/memo.db"
    kw = dict(storage=storage, beam_width=2, max_depth=2, early_barrier=1, latter_barrier=1, show_progress=False)
    first = run_search(memo, study_name="a", mode="beam", **kw)
    measured_once = len(inner.calls)
    second = run_search(memo, study_name="b", mode="exhaustive", **kw)
    # The second study records as many trials as it would alone, but measures only new sets.
    trials_b = len(optuna.load_study(study_name="b", storage=storage).trials)
    assert trials_b >= len(optuna.load_study(study_name="a", storage=storage).trials)
    assert len(inner.calls) - measured_once < trials_b
    assert memo.hits > 0
    # Memory changes no answer: the same search on a fresh evaluator selects the same set.
    alone = run_search(Counting(), study_name="c", mode="exhaustive", **kw)
    assert second.best == alone.best and [t.skip_set for t in second.trials] == [t.skip_set for t in alone.trials]
    assert first.finished and second.finished
