"""What every drafter builder shares: the marker that declares what a builder builds (its class,
hence its capabilities), the size settings (``auto`` or a positive integer) and the cache of
weights a drafter only reads. How a drafter is trained, if it is, is the training layer's
(:mod:`tss_opt.training.trainers`, which names the builders it trains).

A builder lives in its drafter's module, takes ``(target, loaded, **settings)`` (and
``weights``, a :class:`WeightCache`, when it loads weights) and is named by ``_target_`` in
``conf/drafter/<name>.yaml``, which holds its defaults.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tss_opt.config.drafters import DrafterConfigError

if TYPE_CHECKING:
    from tss_opt.decoding.drafter import Drafter
    from tss_opt.decoding.target import TargetModel

__all__ = ["DrafterBuilder", "WeightCache", "builds", "fixed_size", "need_target"]

DrafterBuilder = Callable[..., "Drafter"]


def builds(drafter_class: type) -> Callable[[DrafterBuilder], DrafterBuilder]:
    """Declare what a builder returns: ``drafter_class``, whose ``capabilities`` can then be
    read from a config before anything is built."""

    def mark(builder: DrafterBuilder) -> DrafterBuilder:
        builder.drafter_class = drafter_class  # type: ignore[attr-defined]
        return builder

    return mark


def need_target(drafter: str, setting: str, target: TargetModel | None) -> None:
    """``auto`` measures this target's hardware: refuse clearly without one."""
    if target is None:
        raise DrafterConfigError(
            f"drafter {drafter!r}: {setting}=auto sizes the drafter to the target's hardware and needs the "
            f"target; pass the TargetModel, or fix the size (e.g. {setting}="
            + ("builtin:token_recycle_15.json)" if setting == "template" else "10)")
        )


def fixed_size(drafter: str, setting: str, value: Any) -> int:
    """A size setting that is not ``auto``: a positive integer, else a clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DrafterConfigError(
            f"drafter {drafter!r}: {setting}={value!r}; expected a positive integer, or 'auto' to size it to "
            "the hardware (docs/drafters.md, 'Sized to the hardware')"
        )
    return value


class WeightCache:
    """Weights drafters only read (draft models, EAGLE heads), loaded once per owner of the
    cache: the assembly keeps one for its process, because the evaluator builds a fresh drafter
    per trial and reloading weights each time is wasted work. Drafter state (KV caches,
    tables) lives in the drafter objects, never here."""

    def __init__(self) -> None:
        self._plain: dict[str, Any] = {}
        # EAGLE heads reuse their target's embeddings: keyed per target model, dropped with it.
        self._per_model: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def get(self, key: str, load: Callable[[], Any], model: Any = None) -> Any:
        """The weights stored under ``key`` (per ``model`` when given), loaded on first use."""
        store = self._plain if model is None else self._per_model.setdefault(model, {})
        if key not in store:
            store[key] = load()
        return store[key]
