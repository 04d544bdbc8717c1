"""Trial evaluators built from the configuration, one way: a registry keyed by evaluator
kind (``evaluator.kind``: ``engine``, ``replay``, ``auto``; ``conf/evaluator/*.yaml``), each
entry built from the loaded model, one :class:`~tss_opt.evaluation.prompt_set.PromptSet` and
the group's :class:`EvaluatorSettings`. A custom evaluator is a factory named by
``evaluator._target_``: it gets the composed configuration and the group's other keys.
:func:`configured_evaluator` is the one place a command builds the configured one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly.runtime import Assembly, assemble
from tss_opt.assembly.settings import check_prompts, decode_protocol, require_domain
from tss_opt.errors import UsageError
from tss_opt.evaluation.protocol import ENGINE_EVALUATOR

if TYPE_CHECKING:
    from tss_opt.evaluation.domains import Domain
    from tss_opt.evaluation.evaluator import PromptSetEvaluator
    from tss_opt.evaluation.prompt_set import PromptSet

__all__ = [
    "EVALUATORS",
    "EvaluatorSettings",
    "EvaluatorSpec",
    "build_evaluator",
    "configured_evaluator",
    "evaluator_label",
    "evaluator_settings",
    "prompt_set",
    "validation_evaluator",
]


@dataclass(frozen=True)
class EvaluatorSettings:
    """How a shipped evaluator runs, beside what it runs (the prompt set).

    Attributes:
        kind: the registry key (:data:`EVALUATORS`).
        batch_size: the replay's prompts per batched forward (``evaluator.batch_size``);
            ``None`` = 8 on CPU, 32 on CUDA.
        prefill_store_gib: the byte budget of the kept dense prefills (``prefill_store_gib``).
    """

    kind: str = "engine"
    batch_size: int | None = None
    prefill_store_gib: float | None = None


Builder = Callable[[Assembly, "PromptSet", EvaluatorSettings], "PromptSetEvaluator"]


@dataclass(frozen=True)
class EvaluatorSpec:
    """One shipped evaluator kind.

    Attributes:
        build: the evaluator from the loaded model, the prompt set and the settings.
        study_label: the name the study identity records for it (the factory name studies
            were stored under before the registry, so their names still match).
    """

    build: Builder
    study_label: str


def _engine(rt: Assembly, prompts: PromptSet, settings: EvaluatorSettings) -> PromptSetEvaluator:
    """Real speculative decoding, prompt by prompt (docs/evaluator.md)."""
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator

    return SpecDecodeEvaluator(
        rt.target, rt.loaded.tokenizer, rt.new_drafter, prompts, prefill_store_gib=settings.prefill_store_gib
    )


def _replay(rt: Assembly, prompts: PromptSet, settings: EvaluatorSettings) -> PromptSetEvaluator:
    """One batched greedy generation of the sparse target per trial, the drafter replayed over
    each output (docs/evaluator.md).

    Raises:
        tss_opt.evaluation.replay.ReplayError: ``cost=measured``, ``temperature > 0``, a
            relaxed rule or a drafter the replay cannot reproduce (Token Recycling).
    """
    from tss_opt.evaluation.replay import ReplayEvaluator

    return ReplayEvaluator(
        rt.target, rt.loaded.tokenizer, rt.new_drafter, prompts,
        prefill_store_gib=settings.prefill_store_gib, batch_size=settings.batch_size,
    )


def _auto(rt: Assembly, prompts: PromptSet, settings: EvaluatorSettings) -> PromptSetEvaluator:
    """The replay where it reproduces the engine exactly, the engine otherwise; logs which and
    why (:func:`tss_opt.evaluation.choice.choose_evaluator`, docs/evaluator.md)."""
    from tss_opt.evaluation.choice import announce, choose_evaluator

    protocol = prompts.protocol
    choice = announce(choose_evaluator(
        temperature=protocol.temperature, cost=protocol.cost, device=rt.target.device, dtype=rt.target.dtype,
        drafter=rt.new_drafter(), drafter_name=rt.drafter_cfg.get("name"),
        verification=protocol.verifier.mode,
    ))
    return EVALUATORS[choice.kind].build(rt, prompts, settings)


EVALUATORS: dict[str, EvaluatorSpec] = {
    "engine": EvaluatorSpec(_engine, ENGINE_EVALUATOR),
    "replay": EvaluatorSpec(_replay, "build_replay_evaluator"),
    "auto": EvaluatorSpec(_auto, "build_auto_evaluator"),
}
"""The shipped evaluator kinds, by ``evaluator.kind``."""

_CUSTOM = "_target_"
_SETTING_KEYS = ("kind", "batch_size")


def _group(cfg: DictConfig) -> dict[str, Any]:
    node = cfg.get("evaluator")
    if node is None:
        return {}
    out = OmegaConf.to_container(node, resolve=True)
    assert isinstance(out, dict)
    return out


def _check_kind(kind: str) -> str:
    if kind not in EVALUATORS:
        raise UsageError(
            f"evaluator.kind={kind!r} is not an evaluator; expected one of {', '.join(EVALUATORS)} "
            "(evaluator=NAME), or evaluator._target_=your.factory for your own"
        )
    return kind


def evaluator_settings(cfg: DictConfig, kind: str | None = None) -> EvaluatorSettings:
    """The configured :class:`EvaluatorSettings` (``kind`` replaces ``evaluator.kind``).

    Raises:
        UsageError: an unknown kind, or a key the shipped evaluators do not take.
    """
    group = _group(cfg)
    unknown = sorted(set(group) - set(_SETTING_KEYS) - {_CUSTOM})
    if unknown and not group.get(_CUSTOM):
        raise UsageError(
            f"evaluator.{unknown[0]} is not a setting of the shipped evaluators; expected "
            f"{' or '.join('evaluator.' + k for k in _SETTING_KEYS)}"
        )
    batch_size = group.get("batch_size")
    return EvaluatorSettings(
        kind=_check_kind(str(kind or group.get("kind") or EvaluatorSettings.kind)),
        batch_size=None if batch_size is None else int(batch_size),
        prefill_store_gib=cfg.get("prefill_store_gib"),
    )


def evaluator_label(cfg: DictConfig) -> str:
    """What the study identity records for the configured evaluator: the kind's
    :attr:`EvaluatorSpec.study_label`, or a custom factory's function name."""
    group = _group(cfg)
    if group.get(_CUSTOM):
        return str(group[_CUSTOM]).rsplit(".", 1)[-1]
    return EVALUATORS[_check_kind(str(group.get("kind") or EvaluatorSettings.kind))].study_label


def prompt_set(
    cfg: DictConfig,
    runtime: Assembly,
    domain: Domain | None = None,
    split: str | None = None,
    count: int | None = None,
) -> PromptSet:
    """The prompts an evaluator of ``cfg`` runs: the ``split``'s (default ``cfg.split``) first
    ``count`` examples (default ``search.prompts``, an upper bound: a small user domain has
    fewer), scored by the domain's metrics and decoded under :func:`decode_protocol`."""
    from tss_opt.evaluation.prompt_set import PromptSet

    domain = domain or require_domain(cfg)
    examples = domain.split(split or cfg.split)
    n = count if count is not None else check_prompts(cfg.search.get("prompts"))
    if n is not None:
        examples = examples[:n]
    return PromptSet.of(domain, examples, decode_protocol(cfg, domain, runtime.eos_token_ids, runtime.drafter_cfg))


def build_evaluator(
    cfg: DictConfig,
    kind: str | None = None,
    *,
    runtime: Assembly | None = None,
    prompts: PromptSet | None = None,
    split: str | None = None,
    domain: Domain | None = None,
) -> PromptSetEvaluator:
    """A shipped evaluator: :data:`EVALUATORS`'s entry for ``kind`` (default
    ``evaluator.kind``) built on the loaded model and a prompt set.

    Args:
        cfg: The composed configuration.
        kind: ``engine``, ``replay`` or ``auto`` (default: the configured kind).
        runtime: An already assembled model (default: :func:`assemble` for ``search``).
        prompts: What to run (default: :func:`prompt_set` of ``split`` and ``domain``).
        split: The domain split of the default prompt set (default ``cfg.split``).
        domain: The loaded domain (default: :func:`require_domain` of ``cfg``).

    Raises:
        UsageError: an unknown kind or evaluator setting.
    """
    settings = evaluator_settings(cfg, kind)
    rt = runtime or assemble(cfg, "search")  # trial figures: dtype=auto keeps the study's precision
    if prompts is None:
        prompts = prompt_set(cfg, rt, domain, split)
    return EVALUATORS[settings.kind].build(rt, prompts, settings)


def configured_evaluator(
    cfg: DictConfig,
    runtime: Assembly | None = None,
    split: str | None = None,
    domain: Domain | None = None,
) -> Any:
    """The evaluator ``cfg.evaluator`` names: the one place a command builds its trial
    evaluator from the configuration (search, compare, sweep, validation).

    A shipped kind is built by :func:`build_evaluator` (one loaded model, one loaded domain).
    A custom ``evaluator._target_`` factory is called with ``cfg=`` (its ``split`` set to
    ``split`` when given) and the group's other keys as keyword arguments.
    """
    group = _group(cfg)
    if not group.get(_CUSTOM):
        return build_evaluator(cfg, runtime=runtime, split=split, domain=domain)
    import hydra.utils

    factory = hydra.utils.get_method(str(group.pop(_CUSTOM)))
    group.pop("kind", None)
    if split is not None:
        cfg = OmegaConf.merge(cfg, {"split": split})  # type: ignore[assignment]
    return factory(cfg=cfg, **group)


def validation_evaluator(cfg: DictConfig, evaluator: Any, domain: Domain | None = None) -> Any | None:
    """The evaluator of the domain's validation split, sharing ``evaluator``'s loaded model.

    A shipped evaluator is re-aimed at the validation prompts (:meth:`on_examples`); a custom
    factory is called again with ``split=validation`` in its ``cfg``. ``None`` when the split
    is empty (the search result is then exported without validation, and the caller says so).
    """
    domain = domain or require_domain(cfg)
    n = check_prompts(cfg.search.get("validation_prompts"), "search.validation_prompts")
    examples = domain.split("validation")[: n or None]
    if not examples:
        return None
    if hasattr(evaluator, "on_examples"):
        return evaluator.on_examples(examples)
    return configured_evaluator(cfg, split="validation", domain=domain)
