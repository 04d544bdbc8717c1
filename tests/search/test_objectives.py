"""The objectives' names are written once (tss_opt.config.objectives) and the typed trial result
(Measurement, PerPrompt, TrialRecord) serialises under them."""

from __future__ import annotations

from dataclasses import fields

from tss_opt.config.objectives import (
    ACCEPT_LENGTH,
    COST,
    METRIC,
    OBJECTIVE_NAMES,
    PAIRED_OBJECTIVES,
)
from tss_opt.search.algorithm import Measurement
from tss_opt.search.contract import PER_PROMPT_KEYS, measurement_from
from tss_opt.search.feasibility import PerPrompt
from tss_opt.search.result import TrialRecord


def test_names_are_the_stored_contract() -> None:
    # Stored studies, mapping files and reports carry these strings: they never change.
    assert OBJECTIVE_NAMES == ("accept_length", "metric", "cost")
    assert (ACCEPT_LENGTH, METRIC, COST) == OBJECTIVE_NAMES
    assert PAIRED_OBJECTIVES == ("accept_length", "metric")
    assert PER_PROMPT_KEYS == ("accept_length", "metric", "tokens", "repetition")


def test_names_are_the_typed_values_fields() -> None:
    # The typed values' attributes and the serialised names are the same words.
    assert tuple(f.name for f in fields(Measurement))[:3] == OBJECTIVE_NAMES
    assert tuple(f.name for f in fields(PerPrompt))[:2] == PAIRED_OBJECTIVES


def test_measurement_round_trip() -> None:
    answer = {
        "accept_length": 2.5, "metric": 0.75, "cost": 0.4, "tokens_per_s": 10.0,
        "per_prompt": [{"accept_length": 2.0, "metric": 0.5}, {"accept_length": 3.0, "metric": 1.0}],
    }
    m, extras = measurement_from(answer, frozenset({1}))
    assert m.trial_values() == (2.5, 0.75, 0.4)
    assert m.objectives() == {"accept_length": 2.5, "metric": 0.75, "cost": 0.4}
    assert extras == {"tokens_per_s": 10.0}
    assert m.per_prompt is not None
    assert m.per_prompt.to_dict() == {"accept_length": [2.0, 3.0], "metric": [0.5, 1.0]}
    assert PerPrompt.from_dict(m.per_prompt.to_dict()) == m.per_prompt


def test_trial_record_objectives() -> None:
    given_up = TrialRecord.given_up(frozenset({0}))
    assert given_up.objectives() == {"accept_length": None, "metric": None, "cost": None}
