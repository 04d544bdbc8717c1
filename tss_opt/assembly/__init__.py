"""Assembling a run from the composed configuration: model, target, drafter, domain,
decoding protocol, evaluator and the study's identity.

``settings`` turns the raw config into typed values (model, domain, drafter settings, search
settings, acceptance rule, :class:`~tss_opt.decoding.DecodeProtocol`); ``runtime`` loads the
model (:class:`Assembly`); ``evaluators`` builds the trial evaluators (the ``_target_`` of
``conf/evaluator/*.yaml``: ``tss_opt.assembly.build_evaluator``,
``build_replay_evaluator`` and ``build_auto_evaluator``); ``identity`` names the study. Everything is re-exported here.

Every command (``tss_opt.cli``), the runtime controller and the benchmarks build what they
run through these functions, so one configuration always means one model, one drafter and
one protocol. Nothing here parses the command line: the functions take the composed
configuration (a ``DictConfig`` of :class:`tss_opt.config.TSSConfig`) and tests call them
without Hydra.
"""

from tss_opt.assembly.evaluators import (
    build_auto_evaluator,
    build_evaluator,
    build_replay_evaluator,
    configured_evaluator,
    validation_evaluator,
)
from tss_opt.assembly.identity import protocol, study_identity
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
    model_config,
    model_settings,
    relaxed_settings,
    require_domain,
    search_settings,
)

__all__ = [
    "Assembly",
    "assemble",
    "build_auto_evaluator",
    "build_evaluator",
    "check_prompts",
    "build_replay_evaluator",
    "build_verifier",
    "check_distribution_drafter",
    "relaxed_settings",
    "base_protocol",
    "compose_config",
    "configured_evaluator",
    "decode_protocol",
    "serving_protocol",
    "drafter_config",
    "max_new_tokens_for",
    "model_config",
    "model_settings",
    "protocol",
    "require_domain",
    "search_settings",
    "validation_evaluator",
    "study_identity",
]
