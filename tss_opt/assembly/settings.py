"""The raw configuration turned into typed values, once, at the command's edge: the model
(:class:`~tss_opt.config.ModelConfig`), the loaded domain, the drafter's settings, the search
settings, the acceptance rule and the decoding protocol (:class:`~tss_opt.decoding.DecodeProtocol`).

Below this module the library takes those values, not the Hydra config."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.config import SearchSettings, config_dir
from tss_opt.errors import UsageError

if TYPE_CHECKING:
    from tss_opt.config import ModelConfig
    from tss_opt.config.schema import RelaxedSettings
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.decoding.verify.relaxed import Verifier
    from tss_opt.evaluation.domains import Domain
    from tss_opt.models.precision import Purpose
    from tss_opt.search.tolerance import MetricTolerance


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The shipped configuration composed with command-line style ``overrides`` (no command).

    For scripts and benchmarks: ``assemble(compose_config(["dtype=bfloat16"]))`` loads what
    ``python -m tss_opt.cli.generate dtype=bfloat16`` would.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tss_opt.config import register_configs

    register_configs()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=list(overrides))
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
        return compose(config_name="config", overrides=list(overrides))


def model_config(cfg: DictConfig) -> DictConfig:
    """``model`` with the top-level ``device=`` / ``dtype=`` shortcuts applied."""
    mc = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(mc, dict)
    if cfg.get("device"):
        mc["device"] = cfg.device
    if cfg.get("dtype"):
        mc["dtype"] = cfg.dtype
    return OmegaConf.create(mc)


def model_settings(cfg: DictConfig, purpose: Purpose = "decode") -> ModelConfig:
    """The configured model as a typed :class:`~tss_opt.config.ModelConfig` (shortcuts applied,
    checked against the schema, ``dtype: auto`` resolved for ``purpose``): what the library
    below takes.

    Args:
        cfg: The composed configuration.
        purpose: ``decode`` (generate, serve, evaluate: the device's fastest native precision)
            or ``search`` (studies and what reads them: the precision the exactness rule
            needs, float32 on CPU); see :mod:`tss_opt.models.precision`.
    """
    from tss_opt.models import as_model_config, resolve_model_dtype

    return resolve_model_dtype(as_model_config(model_config(cfg)), purpose)


def require_domain(cfg: DictConfig) -> Domain:
    """The configured domain, loaded; a missing ``+domain=`` is a :class:`UsageError`."""
    from tss_opt.evaluation.domains import available_domains, load_domain

    if cfg.get("domain") is None:
        from tss_opt.config.search_path import domain_config_dirs

        names = available_domains(domain_config_dirs())
        raise UsageError(f"no domain chosen; add +domain=NAME (available: {', '.join(names)})")
    domain_cfg = OmegaConf.to_container(cfg.domain, resolve=True)
    return load_domain(domain_cfg)


def max_new_tokens_for(cfg: DictConfig, domain: Domain) -> int:
    """New tokens per prompt: ``max_new_tokens=``, else ``search.max_new_tokens``, else the
    domain's. An explicit 0 or negative value is an error, never a silent default."""
    for key, value in (("max_new_tokens", cfg.get("max_new_tokens")), ("search.max_new_tokens", cfg.search.get("max_new_tokens"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(
                f"{key}={value!r} is invalid; expected an integer >= 1 (tokens generated per prompt), "
                f"or null for the domain's {domain.config.max_new_tokens}"
            )
        return int(value)
    return int(domain.config.max_new_tokens)


def check_prompts(value: Any, key: str = "search.prompts") -> int | None:
    """``search.prompts`` checked: ``None`` (the domain's count) or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{key}={value!r} is invalid; expected an integer >= 1, or null for the domain's count")
    return int(value)


def drafter_config(cfg: DictConfig) -> dict[str, Any]:
    """The chosen drafter's settings, or the model's default drafter's (``conf/drafter/``)."""
    if cfg.get("drafter") is not None:
        out = OmegaConf.to_container(cfg.drafter, resolve=True)
    else:
        from hydra import compose
        from hydra.core.global_hydra import GlobalHydra

        name = cfg.model.default_drafter
        if GlobalHydra.instance().is_initialized():
            out = OmegaConf.to_container(compose(config_name=f"drafter/{name}").drafter, resolve=True)
        else:
            out = OmegaConf.to_container(OmegaConf.load(config_dir() / "drafter" / f"{name}.yaml"), resolve=True)
    assert isinstance(out, dict)
    return out


def build_verifier(cfg: DictConfig, drafter_cfg: dict[str, Any] | None = None) -> Verifier:
    """The acceptance rule of ``cfg.verification`` with its ``relaxed`` settings.

    A relaxed mode (``diversed``, ``cospec``) with a shipped drafter that gives no
    distribution is refused here, before a model is loaded, naming the drafters that do.

    Raises:
        RelaxedVerificationError: a weight outside [0, 1], a threshold outside [0, 1], a
            drafter without distributions, a missing policy file.
    """
    from tss_opt.config import Verification
    from tss_opt.decoding.verify.relaxed import Verifier, verifier_from_settings

    mode = Verification.parse("verification", str(cfg.get("verification") or "exact"))
    if not mode.lossy:
        return Verifier(mode)
    check_distribution_drafter(mode, drafter_cfg if drafter_cfg is not None else drafter_config(cfg))
    return verifier_from_settings(mode, relaxed_settings(cfg))


def relaxed_config(cfg: DictConfig) -> RelaxedSettings:
    """The ``relaxed`` group as its typed :class:`~tss_opt.config.schema.RelaxedSettings`
    (the rules' settings and ``tune_verification``'s)."""
    from tss_opt.config.schema import RelaxedSettings

    relaxed = cfg.get("relaxed")
    if relaxed is None:
        return RelaxedSettings()
    values = OmegaConf.to_container(relaxed, resolve=True)
    assert isinstance(values, dict)
    return RelaxedSettings(**values)


def relaxed_settings(cfg: DictConfig) -> dict[str, Any]:
    """The ``relaxed`` group as a plain dict (the verifier's settings only)."""
    relaxed = cfg.get("relaxed") or {}
    keys = ("weight", "weight_policy", "policy", "tau_draft", "tau_target")
    return {k: relaxed.get(k) for k in keys if relaxed.get(k) is not None}


def check_distribution_drafter(mode: Any, drafter: dict[str, Any]) -> None:
    """Refuse a relaxed ``mode`` with a shipped drafter that gives no distribution.

    Raises:
        RelaxedVerificationError: naming the drafter and the ones that give distributions.
    """
    from tss_opt.decoding.drafters.registry import distribution_drafters, drafter_capabilities
    from tss_opt.decoding.verify.relaxed import refuse_drafter

    caps = drafter_capabilities(drafter)  # the drafter class's declaration, nothing built
    if caps is None or not caps.distribution:
        raise refuse_drafter(mode, str(drafter.get("name")), distribution_drafters())


def metric_tolerance(cfg: DictConfig) -> MetricTolerance:
    """The search's metric tolerance (``search.eps_metric``, ``search.relative``,
    ``search.eps_metric_abs``) as one value, for the commands that judge a metric against
    dense after the search (``report``, ``tune_verification``). Read as given, without the
    search's own range checks: a tuning may ask for a gain the search could not."""
    from tss_opt.search.tolerance import MetricTolerance

    s = cfg.search
    return MetricTolerance(float(s.eps_metric), bool(s.relative), float(s.eps_metric_abs))


def search_settings(cfg: DictConfig) -> SearchSettings:
    """The :class:`SearchSettings` part of the ``search`` preset (protocol knobs left out)."""
    names = {f.name for f in fields(SearchSettings)}
    values = OmegaConf.to_container(cfg.search, resolve=True)
    assert isinstance(values, dict)
    return SearchSettings(**{k: v for k, v in values.items() if k in names})


def base_protocol(cfg: DictConfig, eos_token_ids: Sequence[int] = ()) -> DecodeProtocol:
    """The settings every decoding command reads from the configuration, in one value:
    ``scope``, ``temperature``, ``cost``, ``reuse_prefill``, the stop tokens and
    ``max_new_tokens=`` (96 when null); exact verification and no system prompt (those
    depend on the domain and the drafter: :func:`decode_protocol`)."""
    from tss_opt.decoding.protocol import DEFAULT_MAX_NEW_TOKENS, DecodeProtocol

    return DecodeProtocol(
        max_new_tokens=int(cfg.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS),
        scope=str(cfg.scope),
        temperature=float(cfg.temperature),
        cost=str(cfg.cost),
        eos_token_ids=tuple(eos_token_ids),
        reuse_prefill=bool(cfg.get("reuse_prefill", True)),
    )


def decode_protocol(
    cfg: DictConfig,
    domain: Domain,
    eos_token_ids: Sequence[int] = (),
    drafter_cfg: dict[str, Any] | None = None,
) -> DecodeProtocol:
    """The decoding protocol a configuration sets for ``domain``: built once here and passed
    whole to the evaluators (:class:`~tss_opt.decoding.protocol.DecodeProtocol`).

    :func:`base_protocol` with the length of :func:`max_new_tokens_for`, the domain's system
    prompt and the acceptance rule (:func:`build_verifier`, checked against ``drafter_cfg``).
    """
    return base_protocol(cfg, eos_token_ids).replace(
        max_new_tokens=max_new_tokens_for(cfg, domain),
        system_prompt=domain.config.system_prompt,
        verification=build_verifier(cfg, drafter_cfg),
    )
