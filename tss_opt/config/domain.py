"""The domain schema (``conf/domain/*.yaml``): data, prompt template, metric and split sizes.

Loading the data and splitting it is :mod:`tss_opt.evaluation.domains`; this module is only
the schema, so that composing a configuration imports no model or metric library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DomainConfig", "DomainConfigError", "load_domain_yaml", "typed_domain_config"]

DEFAULT_MAX_NEW_TOKENS = 96
"""The paper's generation length per prompt (TSS.md): a domain's default, the decoding
protocol's and the commands' when ``max_new_tokens`` is null."""


@dataclass
class DomainConfig:
    """One domain's settings (the schema of ``conf/domain/*.yaml``).

    Attributes:
        name: The domain's name, used as the mapping key at run time.
        data: Where the records come from (``builtin:<file>``, a path, or ``hf:...``).
        prompt_template: ``str.format`` template over a record's fields -> the user message.
        system_prompt: Optional system message for chat templates (prepended to plain text
            otherwise).
        metric: The search objective, a name in the metrics registry.
        reference_field: The record field holding the reference(s): a string or a list of
            strings.
        reference_pattern: Optional regex applied to each reference; group 1 (or the whole
            match when the pattern has no group) is the reference used. A reference it does
            not match is an error naming the record.
        extra_metrics: Further registered metrics reported beside it.
        max_new_tokens: Generation length per prompt (greedy).
        pool_size: Records kept from the start of the data (file order).
        calibration_size: Prompts used by the skip-set search.
        validation_size: Prompts that check the search's candidates before the mapping is
            written, disjoint from calibration.
        heldout_size: Prompts used for reports only, disjoint from the other two.
        shuffle_seed: ``random.Random`` seed of the pool shuffle that defines the splits.
        train_data: Optional extra records for training drafters (``train_drafter``), in the
            format of ``data`` and formatted with the same template; they must be disjoint
            from the pool (records equal to a validation or held-out prompt are dropped).
            ``None``: the domain's training text is its calibration prompts only.
    """

    name: str
    data: str
    prompt_template: str = "{prompt}"
    system_prompt: str | None = None
    metric: str = "rouge_l"
    reference_field: str = "references"
    reference_pattern: str | None = None
    extra_metrics: list[str] = field(default_factory=list)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    pool_size: int = 80
    calibration_size: int = 16
    validation_size: int = 16
    heldout_size: int = 48
    shuffle_seed: int = 42
    train_data: str | None = None


class DomainConfigError(ValueError):
    """A domain node does not fit the schema (an unknown key, a wrong type, a missing ``data``)."""


def typed_domain_config(cfg: DomainConfig | Mapping[str, Any]) -> DomainConfig:
    """A domain node (Hydra's ``cfg.domain``, a dict, a loaded YAML) merged over the schema's
    defaults into a typed :class:`DomainConfig`.

    Raises:
        DomainConfigError: The node does not fit the schema (the message is OmegaConf's).
    """
    try:
        source = OmegaConf.structured(cfg) if isinstance(cfg, DomainConfig) else cfg
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DomainConfig), source))
    except OmegaConfBaseException as e:
        raise DomainConfigError(str(e)) from e
    assert isinstance(config, DomainConfig)  # to_object of a DomainConfig schema
    return config


def load_domain_yaml(path: str | os.PathLike[str]) -> Any:
    """A domain YAML file as read by the configuration (interpolations as Hydra's); the
    caller checks it is a mapping and types it with :func:`typed_domain_config`."""
    return OmegaConf.load(path)
