"""Trial evaluators built from the configuration: the shipped factories (``evaluator._target_``
of ``conf/evaluator/*.yaml``) and :func:`configured_evaluator`, the one place a command builds
the configured one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly.runtime import Assembly, assemble
from tss_opt.assembly.settings import check_prompts, decode_protocol, require_domain

if TYPE_CHECKING:
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.evaluation.domains import Domain
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
    from tss_opt.evaluation.replay import ReplayEvaluator


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
        prefill_store_gib=cfg.get("prefill_store_gib"),
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
        prefill_store_gib=cfg.get("prefill_store_gib"),
    )


def build_auto_evaluator(
    cfg: DictConfig,
    runtime: Assembly | None = None,
    split: str | None = None,
    prompts: int | None = None,
    batch_size: int | None = None,
    protocol: DecodeProtocol | None = None,
    domain: Domain | None = None,
) -> SpecDecodeEvaluator | ReplayEvaluator:
    """``evaluator=auto`` (the default): the replay evaluator where it reproduces the engine
    exactly, the engine otherwise; logs which and why
    (:func:`tss_opt.evaluation.choice.choose_evaluator`, docs/evaluator.md). Arguments as
    :func:`build_replay_evaluator`."""
    from tss_opt.evaluation.choice import announce, choose_evaluator

    rt, _, domain, protocol = _evaluator_args(cfg, runtime, split, prompts, protocol, domain)
    choice = announce(choose_evaluator(
        temperature=protocol.temperature, cost=protocol.cost, device=rt.target.device, dtype=rt.target.dtype,
        drafter=rt.new_drafter(), drafter_name=rt.drafter_cfg.get("name"),
        verification=protocol.verifier.mode,
    ))
    if choice.kind == "replay":
        return build_replay_evaluator(cfg, rt, split, prompts, batch_size, protocol, domain)
    return build_evaluator(cfg, rt, split, prompts, protocol, domain)


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
