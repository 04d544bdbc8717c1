"""Evaluators built one way: a registry keyed by ``evaluator.kind``, or your own factory."""

from __future__ import annotations

from typing import Any

import pytest

from tss_opt.assembly import (
    EVALUATORS,
    Assembly,
    EvaluatorSettings,
    build_evaluator,
    compose_config,
    configured_evaluator,
    evaluator_settings,
    prompt_set,
    validation_evaluator,
)
from tss_opt.decoding.target import TargetModel
from tss_opt.errors import UsageError
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.replay import ReplayEvaluator

BASE = ["+domain=qa", "+model=tiny", "search.prompts=3", "max_new_tokens=8"]
CALLS: list[dict[str, Any]] = []


def make_evaluator(cfg, **settings):  # noqa: ANN001, ANN003, ANN201 - a user's factory, as documented
    CALLS.append({"split": cfg.split, **settings})
    return ("mine", cfg.split)


def test_every_shipped_group_names_a_registered_kind():
    for name in ("auto", "engine", "replay"):
        cfg = compose_config([f"evaluator={name}"])
        assert evaluator_settings(cfg).kind == name and name in EVALUATORS
    assert evaluator_settings(compose_config(["evaluator=replay", "evaluator.batch_size=4"])) == EvaluatorSettings(
        kind="replay", batch_size=4, prefill_store_gib=8.0
    )


def test_bad_kinds_and_settings_are_refused_with_the_fix():
    with pytest.raises(UsageError, match=r"evaluator.kind='fast' is not an evaluator; expected one of engine, replay, auto"):
        evaluator_settings(compose_config(["evaluator.kind=fast"]))
    with pytest.raises(UsageError, match=r"evaluator.batchsize is not a setting .*evaluator.batch_size"):
        evaluator_settings(compose_config(["+evaluator.batchsize=4"]))


def test_a_custom_factory_gets_the_config_and_its_keys_and_the_validation_split():
    CALLS.clear()
    cfg = compose_config([*BASE, f"evaluator._target_={__name__}.make_evaluator", "+evaluator.level=2"])
    assert configured_evaluator(cfg) == ("mine", "calibration")
    assert validation_evaluator(cfg, ("mine", "calibration")) == ("mine", "validation")
    assert CALLS == [{"split": "calibration", "batch_size": None, "level": 2},
                     {"split": "validation", "batch_size": None, "level": 2}]


def test_the_registry_builds_each_kind_on_one_prompt_set(tiny64):
    cfg = compose_config(BASE)
    rt = Assembly(loaded=tiny64, target=TargetModel(tiny64.model), drafter_cfg={"name": "pld"})
    prompts = prompt_set(cfg, rt)
    assert len(prompts.examples) == 3 and prompts.protocol.max_new_tokens == 8
    engine = build_evaluator(cfg, "engine", runtime=rt, prompts=prompts)
    replay = build_evaluator(cfg, "replay", runtime=rt, prompts=prompts)
    assert type(engine) is SpecDecodeEvaluator and type(replay) is ReplayEvaluator
    assert engine.prompts == prompts and replay.examples == prompts.examples
    assert isinstance(configured_evaluator(cfg, runtime=rt), ReplayEvaluator)  # auto, the default, on float64
    val = validation_evaluator(cfg, engine)
    assert val.prompts.protocol == engine.protocol and val.examples != engine.examples
