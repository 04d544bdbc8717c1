"""The drafter registry: a lookup from a drafter config to its builder, nothing more.

Each drafter module declares its builder (marked with
:func:`~tss_opt.decoding.drafters.building.builds`: the class it returns, so its
``capabilities``), its capabilities and its sizing prior; its
defaults live once, in ``conf/drafter/<name>.yaml``, read into a
:class:`~tss_opt.config.drafters.DrafterSpec` by the config layer. Adding a drafter: write the
class and its builder (in its module, or anywhere importable), add ``conf/drafter/<name>.yaml``
with ``_target_`` naming the builder (see docs/drafters.md).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tss_opt.config.drafters import DrafterConfigError, DrafterSpec, available_drafters
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities
from tss_opt.decoding.drafters.building import DrafterBuilder, WeightCache

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel

__all__ = [
    "DrafterConfigError",
    "available_drafters",
    "build_drafter",
    "distribution_drafters",
    "drafter_builder",
    "drafter_capabilities",
]


def _builder(path: str) -> DrafterBuilder:
    module, _, attr = path.rpartition(".")
    try:
        builder = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise DrafterConfigError(f"drafter _target_={path!r} cannot be imported: {e}") from e
    if not callable(builder):
        raise DrafterConfigError(f"drafter _target_={path!r} is not a function; name a drafter builder")
    return builder  # type: ignore[no-any-return]


def drafter_builder(cfg: DrafterSpec | Mapping[str, Any]) -> DrafterBuilder:
    """The builder of the drafter ``cfg`` describes (its ``_target_``, or its shipped file's).

    Raises:
        DrafterConfigError: unknown drafter name, or a builder that cannot be imported.
    """
    return _builder(DrafterSpec.from_config(cfg).builder)


def drafter_capabilities(cfg: DrafterSpec | Mapping[str, Any]) -> DrafterCapabilities | None:
    """The class-level capabilities of the drafter ``cfg`` builds (its builder marked with
    ``builds``), without building it; ``None`` when the builder names no class.

    Capabilities that depend on the drafter's parts (SAMD's fallback, TAPS members) are the
    instance's; this is the class's declaration.

    Raises:
        DrafterConfigError: unknown drafter name, or a builder that cannot be imported.
    """
    cls = getattr(drafter_builder(cfg), "drafter_class", None)
    return None if cls is None else cls.capabilities


def distribution_drafters() -> list[str]:
    """The shipped drafters (``conf/drafter/``) whose class gives a per-node distribution:
    the ones relaxed verification accepts."""
    out = []
    for name in available_drafters():
        caps = drafter_capabilities({"name": name})
        if caps is not None and caps.distribution:
            out.append(name)
    return out


def build_drafter(
    cfg: DrafterSpec | Mapping[str, Any], target: TargetModel, loaded: LoadedModel, *, weights: WeightCache | None = None
) -> Drafter:
    """Build the drafter ``cfg`` describes: its builder called with its settings.

    Args:
        cfg: a :class:`DrafterSpec`, or a drafter config (``name`` of a shipped drafter, whose
            file supplies the defaults, and/or ``_target_``, a builder's dotted path).
        target: the verifier (self-drafting and EAGLE use its model; sizing measures it).
        loaded: the loaded target model with its config and tokenizer.
        weights: where builders keep weights a drafter only reads (the assembly passes its
            own, so that a drafter built per trial reuses them); ``None``: a fresh cache.

    Raises:
        DrafterConfigError: unknown name (the message lists the available ones), a builder
            that cannot be imported, a setting the builder does not take, or a mandatory
            setting (``???``) that the chosen options need.
    """
    spec = DrafterSpec.from_config(cfg)
    builder = _builder(spec.builder)
    settings = dict(spec.settings)
    params = inspect.signature(builder).parameters
    if "weights" in params:
        settings["weights"] = weights
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = [p for p in params if p not in ("target", "loaded", "weights")]
        extra = sorted(set(settings) - set(accepted) - {"weights"})
        if extra:
            raise DrafterConfigError(
                f"drafter {spec.name!r} does not take setting(s) {', '.join(extra)}; it takes: {', '.join(accepted)}"
            )
        missing = [p.name for p in params.values()
                   if p.default is inspect.Parameter.empty and p.name not in ("target", "loaded")
                   and p.name not in settings]
        if missing:
            raise DrafterConfigError(
                f"drafter {spec.name!r} needs setting(s) {', '.join(missing)}; give them in its config "
                "(the shipped conf/drafter/<name>.yaml holds every default)"
            )
    return builder(target=target, loaded=loaded, **settings)
