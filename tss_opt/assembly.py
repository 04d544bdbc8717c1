"""Assembling a run from the composed configuration: model, target, drafter, domain,
evaluator and the study's identity.

Every command (``tss_opt.cli``), the runtime controller and the benchmarks build what they
run through these functions, so one configuration always means one model, one drafter and
one protocol. Nothing here parses the command line: the functions take the composed
configuration (a ``DictConfig`` of :class:`tss_opt.config.TSSConfig`) and tests call them
without Hydra.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.config import SearchSettings, config_dir
from tss_opt.errors import UsageError

if TYPE_CHECKING:
    from tss_opt.config import ModelConfig
    from tss_opt.decoding import Drafter, TargetModel
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.decoding.verify.relaxed import Verifier
    from tss_opt.evaluation.domains import Domain
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
    from tss_opt.evaluation.replay import ReplayEvaluator
    from tss_opt.models import LoadedModel

__all__ = [
    "Assembly",
    "assemble",
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


def model_settings(cfg: DictConfig) -> ModelConfig:
    """The configured model as a typed :class:`~tss_opt.config.ModelConfig` (shortcuts applied,
    checked against the schema): what the library below takes."""
    from tss_opt.models import as_model_config

    return as_model_config(model_config(cfg))


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


@dataclass
class Assembly:
    """A loaded target with its drafter factory: what every decoding command needs.

    Attributes:
        loaded: The model, its tokenizer and config.
        target: The verifier with its skip mechanism.
        drafter_cfg: The drafter's config (``conf/drafter/<name>.yaml`` with overrides).
    """

    loaded: LoadedModel
    target: TargetModel
    drafter_cfg: dict[str, Any]

    def new_drafter(self) -> Drafter | None:
        """A fresh drafter (its own state); weights it only reads are shared per process."""
        from tss_opt.decoding.drafters import build_drafter

        return build_drafter(self.drafter_cfg, self.target, self.loaded)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.loaded.model.generation_config.eos_token_id
        if ids is None:
            ids = self.loaded.tokenizer.eos_token_id
        return [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))


def assemble(cfg: DictConfig) -> Assembly:
    """Load the configured model and wrap it as a skippable target with its drafter config."""
    from tss_opt.decoding import TargetModel
    from tss_opt.models import load_model

    loaded = load_model(model_settings(cfg))
    target = TargetModel(loaded.model, layers_path=loaded.config.layers_path, max_context=loaded.config.max_context)
    return Assembly(loaded=loaded, target=target, drafter_cfg=drafter_config(cfg))


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


def serving_protocol(cfg: DictConfig, runtime: Assembly) -> DecodeProtocol:
    """The runtime's protocol: :func:`base_protocol` (``max_new_tokens=`` is the default
    request length; each domain has its own system prompt) with the configured rule."""
    return base_protocol(cfg, runtime.eos_token_ids).replace(verification=build_verifier(cfg, runtime.drafter_cfg))


def _evaluator_args(
    cfg: DictConfig,
    runtime: Assembly | None,
    split: str | None,
    prompts: int | None,
    protocol: DecodeProtocol | None,
    domain: Domain | None = None,
) -> tuple[Assembly, list[Any], Domain, DecodeProtocol]:
    """What both evaluators take: the runtime, the split's examples, the domain and the protocol."""
    domain = domain or require_domain(cfg)
    rt = runtime or assemble(cfg)
    examples = domain.split(split or cfg.split)
    n = prompts if prompts is not None else check_prompts(cfg.search.get("prompts"))
    if n is not None:  # a preset's prompt count is an upper bound (a small user domain has fewer)
        examples = examples[:n]
    if protocol is None:
        protocol = decode_protocol(cfg, domain, rt.eos_token_ids, rt.drafter_cfg)
    return rt, examples, domain, protocol


def build_evaluator(
    cfg: DictConfig,
    runtime: Assembly | None = None,
    split: str | None = None,
    prompts: int | None = None,
    protocol: DecodeProtocol | None = None,
    domain: Domain | None = None,
) -> SpecDecodeEvaluator:
    """The default trial evaluator (``evaluator=engine``): speculative decoding over the
    domain's split with the configured model and drafter.

    Args:
        cfg: The composed configuration.
        runtime: An already assembled model (default: :func:`assemble`).
        split: The domain split (default ``cfg.split``).
        prompts: How many prompts of the split (default ``cfg.search.prompts``, an upper bound).
        protocol: The decoding protocol (default: :func:`decode_protocol` of ``cfg``).
        domain: The loaded domain (default: :func:`require_domain` of ``cfg``).
    """
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator

    rt, examples, domain, protocol = _evaluator_args(cfg, runtime, split, prompts, protocol, domain)
    return SpecDecodeEvaluator(
        rt.target, rt.loaded.tokenizer, rt.new_drafter, examples, domain.metric,
        protocol=protocol, extra_metrics=domain.extra_metrics,
    )


def build_replay_evaluator(
    cfg: DictConfig,
    runtime: Assembly | None = None,
    split: str | None = None,
    prompts: int | None = None,
    batch_size: int | None = None,
    protocol: DecodeProtocol | None = None,
    domain: Domain | None = None,
) -> ReplayEvaluator:
    """The replay evaluator (``evaluator=replay``): one batched greedy generation of the
    sparse target per trial, the drafter replayed over each output (docs/evaluator.md).

    Args:
        cfg, runtime, split, prompts, protocol, domain: as :func:`build_evaluator`.
        batch_size: prompts per batched forward (``evaluator.batch_size``); ``None`` = 8 on
            CPU, 32 on CUDA.

    Raises:
        tss_opt.evaluation.replay.ReplayError: ``cost=measured``, ``temperature > 0``, a
            relaxed rule or a drafter the replay cannot reproduce (Token Recycling).
    """
    from tss_opt.evaluation.replay import ReplayEvaluator

    rt, examples, domain, protocol = _evaluator_args(cfg, runtime, split, prompts, protocol, domain)
    return ReplayEvaluator(
        rt.target, rt.loaded.tokenizer, rt.new_drafter, examples, domain.metric,
        protocol=protocol, extra_metrics=domain.extra_metrics, batch_size=batch_size,
    )


def configured_evaluator(
    cfg: DictConfig,
    runtime: Assembly | None = None,
    split: str | None = None,
    domain: Domain | None = None,
) -> Any:
    """The evaluator ``cfg.evaluator`` names (``_target_`` plus its settings): the one place
    a command builds its trial evaluator from the configuration.

    The factory is called with ``cfg=`` and the group's settings; ``runtime``, ``split`` and
    ``domain`` are passed when given and the factory takes them (the shipped factories do:
    one loaded model, one loaded domain). A custom factory without a ``split`` parameter
    cannot serve another split: ``None`` then.
    """
    import inspect

    import hydra.utils

    ev_cfg = OmegaConf.to_container(cfg.evaluator, resolve=True)
    assert isinstance(ev_cfg, dict)
    factory = hydra.utils.get_method(str(ev_cfg.pop("_target_")))
    params = inspect.signature(factory).parameters
    if split is not None and "split" not in params:
        return None
    given = {"runtime": runtime, "split": split, "domain": domain}
    kwargs = {k: v for k, v in given.items() if v is not None and k in params}
    return factory(cfg=cfg, **kwargs, **ev_cfg)


def validation_evaluator(cfg: DictConfig, evaluator: Any, domain: Domain | None = None) -> Any | None:
    """The evaluator of the domain's validation split, sharing ``evaluator``'s loaded model.

    The default evaluator is re-aimed at the validation prompts (:meth:`on_examples`); a
    custom ``evaluator._target_`` is called again with ``split="validation"`` when it takes a
    ``split`` argument. ``None`` when neither applies (the search result is then exported
    without validation, and the caller says so).
    """
    domain = domain or require_domain(cfg)
    n = check_prompts(cfg.search.get("validation_prompts"), "search.validation_prompts")
    examples = domain.split("validation")[: n or None]
    if not examples:
        return None
    if hasattr(evaluator, "on_examples"):
        return evaluator.on_examples(examples)
    return configured_evaluator(cfg, split="validation", domain=domain)


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
    if mode is Verification.exact:
        return Verifier(mode)
    check_distribution_drafter(mode, drafter_cfg if drafter_cfg is not None else drafter_config(cfg))
    return verifier_from_settings(mode, relaxed_settings(cfg))


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
    from tss_opt.decoding.drafters.registry import drafter_capabilities
    from tss_opt.decoding.verify.relaxed import refuse_drafter

    caps = drafter_capabilities(drafter)  # the drafter class's declaration, nothing built
    if caps is None or not caps.distribution:
        raise refuse_drafter(mode, str(drafter.get("name")))


# ------------------------------------------------------------------------ study identity
def search_settings(cfg: DictConfig) -> SearchSettings:
    """The :class:`SearchSettings` part of the ``search`` preset (protocol knobs left out)."""
    names = {f.name for f in fields(SearchSettings)}
    values = OmegaConf.to_container(cfg.search, resolve=True)
    assert isinstance(values, dict)
    return SearchSettings(**{k: v for k, v in values.items() if k in names})


def protocol(cfg: DictConfig, domain: Domain | None = None) -> dict[str, Any]:
    """What one trial measures (:data:`tss_opt.search.identity.PROTOCOL_KEYS`); ``domain``:
    the loaded domain (default: loaded from ``cfg``)."""
    domain = domain or require_domain(cfg)
    mc = model_settings(cfg)
    proto = {
        "prompts": min(check_prompts(cfg.search.prompts) or domain.config.calibration_size, domain.config.calibration_size),
        "max_new_tokens": max_new_tokens_for(cfg, domain),
        "split": cfg.split,
        "scope": str(cfg.scope),
        "cost": str(cfg.cost),
        "temperature": float(cfg.temperature),
        "dtype": mc.dtype,
    }
    # A lossy rule measures other outputs: studies under different rules never mix. Exact
    # verification (the default) adds no key, so earlier study names still match.
    verification = _verification_label(cfg)
    if verification != "exact":
        proto["verification"] = verification
    # Trials of the replay evaluator measure no tokens/s: a study never mixes the two. The
    # default (engine) adds no key, so study names from before this key existed still match.
    target = str(OmegaConf.select(cfg, "evaluator._target_") or "")
    if target and not target.endswith(".build_evaluator"):
        proto["evaluator"] = target.rsplit(".", 1)[-1]
    return proto


def _verification_label(cfg: DictConfig) -> str:
    """``exact``, or the relaxed rule with its settings (``diversed(w=0.6)``, ...)."""
    from tss_opt.decoding.verify.relaxed import settings_label

    return settings_label(str(cfg.get("verification") or "exact"), relaxed_settings(cfg))


def study_identity(cfg: DictConfig, domain: Domain | None = None) -> tuple[str, dict[str, Any]]:
    """The study name and metadata a configuration maps to (no model is loaded).

    The name carries a hash of the search settings (:func:`tss_opt.search.study_name_for`) and
    one of the protocol, so changing either starts a new study instead of mixing measurements.
    ``domain``: the loaded domain (default: loaded from ``cfg``).
    """
    from tss_opt.models import model_id_for
    from tss_opt.search.identity import protocol_hash, study_name_for

    domain = domain or require_domain(cfg)
    mc = model_settings(cfg)
    drafter = drafter_config(cfg)
    settings = search_settings(cfg)
    proto = protocol(cfg, domain)
    name = cfg.get("study_name") or study_name_for(
        domain=domain.name, model=mc.name, drafter=str(drafter.get("name")), split=cfg.split, settings=settings
    ) + f".p{protocol_hash(proto)}"
    metadata = {
        "domain": domain.name,
        "model": model_id_for(mc),
        "model_name": mc.name,
        "num_layers": mc.num_layers,
        "drafter": drafter.get("name"),
        "drafter_config": drafter,
        "metric": domain.config.metric,
        "preset": cfg.search.preset,
        "split": cfg.split,
        "protocol": proto,
    }
    if "verification" in proto:  # lossy: say so in the dashboard and keep what rebuilds the rule
        metadata["verification"] = proto["verification"]
        metadata["lossy"] = True
        metadata["relaxed"] = {"mode": str(cfg.verification), **relaxed_settings(cfg)}
    return name, metadata
