"""Drafter settings: the shipped ``conf/drafter/<name>.yaml`` files are the one place a drafter's
defaults are written; :class:`DrafterSpec` carries them, merged with the user's values, as a
typed value below the command layer (the decoding layer reads no YAML and no OmegaConf).

A drafter config is a mapping with ``name``, ``_target_`` (the dotted path of its builder) and
the drafter's settings::

    name: pld
    _target_: tss_opt.decoding.drafters.prompt_lookup.build_pld
    num_tokens: 10

A config that names a shipped drafter without another ``_target_`` takes that file's builder
and every default it leaves out; a config with its own ``_target_`` (your builder) is taken as
given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tss_opt.config.paths import config_dir
from tss_opt.errors import TSSError

__all__ = ["MISSING", "DrafterConfigError", "DrafterSpec", "available_drafters", "shipped_drafter"]

MISSING = "???"
"""OmegaConf's mandatory value; a setting left at it is dropped (the builder says what is
missing when it is really needed, e.g. eagle's checkpoint unless ``random_init``)."""
_RESERVED = ("name", "_target_")


class DrafterConfigError(TSSError):
    """A drafter config names an unknown drafter or gives settings it does not take."""


def available_drafters() -> list[str]:
    """The shipped drafter configs (``conf/drafter/*.yaml``), by name."""
    return sorted(p.stem for p in (config_dir() / "drafter").glob("*.yaml"))


def shipped_drafter(name: Any) -> dict[str, Any]:
    """``conf/drafter/<name>.yaml`` as a plain dict (interpolations resolved).

    Raises:
        DrafterConfigError: no such shipped drafter (the message lists them).
    """
    from omegaconf import OmegaConf

    if name not in available_drafters():
        raise DrafterConfigError(
            f"unknown drafter {name!r}; available: {', '.join(available_drafters())}. "
            "Set drafter.name to one of them (or give drafter._target_ for your own builder)"
        )
    out = OmegaConf.to_container(OmegaConf.load(config_dir() / "drafter" / f"{name}.yaml"), resolve=True)
    assert isinstance(out, dict)
    return out


def _plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        out = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(out, dict)
        return out
    return dict(cfg)


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter to build: its builder and every setting it takes.

    Attributes:
        name: the drafter's name (statistics, errors, acceptance profiles); ``None`` for a
            builder given only by ``_target_``.
        builder: dotted path of the builder function.
        settings: keyword arguments of the builder (the shipped defaults under the user's
            values; mandatory values left unset dropped).
    """

    name: str | None
    builder: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: DrafterSpec | Mapping[str, Any]) -> DrafterSpec:
        """From a drafter config (a mapping or an OmegaConf node).

        Raises:
            DrafterConfigError: neither a shipped ``name`` nor a ``_target_``.
        """
        if isinstance(cfg, DrafterSpec):
            return cfg
        given = _plain(cfg)
        name = given.get("name")
        target = given.get("_target_")
        values: dict[str, Any] = {}
        # The shipped file is read once: for its builder (none given; an unknown name is
        # refused there) and its defaults (unless the config names another builder).
        shipped = shipped_drafter(name) if not target or name in available_drafters() else None
        if shipped is not None and target in (None, "", shipped["_target_"]):
            target = shipped["_target_"]
            values.update({k: v for k, v in shipped.items() if k not in _RESERVED})
        values.update({k: v for k, v in given.items() if k not in _RESERVED})
        settings = {k: v for k, v in values.items() if not (isinstance(v, str) and v == MISSING)}
        return cls(name=None if name is None else str(name), builder=str(target), settings=settings)
