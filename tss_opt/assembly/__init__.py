"""Assembling a run from the composed configuration: model, target, drafter, domain,
decoding protocol, evaluator and the study's identity.

``settings`` turns the raw config into typed values (model, domain, drafter settings, search
settings, acceptance rule, :class:`~tss_opt.decoding.DecodeProtocol`); ``runtime`` loads the
model (:class:`Assembly`); ``evaluators`` builds the trial evaluators (the registry
:data:`EVALUATORS`, keyed by ``evaluator.kind`` of ``conf/evaluator/*.yaml``);
``identity`` names the study (:class:`~tss_opt.evaluation.protocol.StudyProtocol`).
Everything is re-exported here.

Every command (``tss_opt.cli``), the runtime controller and the benchmarks build what they
run through these functions, so one configuration always means one model, one drafter and
one protocol. Nothing here parses the command line: the functions take the composed
configuration (a ``DictConfig`` of :class:`tss_opt.config.TSSConfig`) and tests call them
without Hydra.
"""

from tss_opt.assembly.evaluators import (
    EVALUATORS,
    EvaluatorSettings,
    build_evaluator,
    configured_evaluator,
    evaluator_settings,
    prompt_set,
    validation_evaluator,
)
from tss_opt.assembly.identity import study_identity, study_protocol
from tss_opt.assembly.runtime import Assembly, assemble, serving_protocol
from tss_opt.assembly.settings import (
    base_protocol,
    build_verifier,
    check_distribution_drafter,
    check_prompts,
    compose_config,
    decode_protocol,
    drafter_config,
    max_new_tokens_for,
    metric_tolerance,
    model_config,
    model_settings,
    relaxed_config,
    relaxed_settings,
    require_domain,
    search_settings,
)

__all__ = [
    "EVALUATORS",
    "Assembly",
    "EvaluatorSettings",
    "assemble",
    "build_evaluator",
    "check_prompts",
    "build_verifier",
    "check_distribution_drafter",
    "relaxed_config",
    "relaxed_settings",
    "base_protocol",
    "compose_config",
    "configured_evaluator",
    "decode_protocol",
    "serving_protocol",
    "drafter_config",
    "evaluator_settings",
    "max_new_tokens_for",
    "metric_tolerance",
    "model_config",
    "model_settings",
    "prompt_set",
    "require_domain",
    "search_settings",
    "validation_evaluator",
    "study_identity",
    "study_protocol",
]
