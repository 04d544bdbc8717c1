"""Fields that name a study, declared on the frozen value that holds them.

A study is found again by a hash of what its trials measure (the protocol: prompts, length,
scope, cost, dtype...). Each setting that changes what is measured declares, where it is
defined, whether and how it enters that identity: :func:`identity_field` puts an
:class:`IdentityRule` in the dataclass field's metadata, and :func:`identity_of` reads the
identity of any such value back. A new setting is then one field declaration: the stored
mapping and its hash follow from it.

``omitted`` is how a setting added after studies were stored keeps their names: the value
that reproduces the former measurement (``compile=False``, exact verification) adds no key,
so the mapping (and its hash) of a study that does not use the setting is what it was before
the setting existed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["IdentityRule", "identity_field", "identity_of"]

_IDENTITY = "tss_opt.identity"
_NO_VALUE: Any = object()


@dataclass(frozen=True)
class IdentityRule:
    """How one dataclass field enters a study's identity.

    Attributes:
        key: its key in the identity mapping (``None``: the field's name).
        omitted: a value that adds no key (the setting's value before it existed); unset:
            the key is always present.
        nested: the field holds a dataclass value whose own identity fields are merged in.
    """

    key: str | None = None
    omitted: Any = _NO_VALUE
    nested: bool = False


def identity_field(
    default: Any = dataclasses.MISSING,
    *,
    key: str | None = None,
    omitted: Any = _NO_VALUE,
    nested: bool = False,
    **field_kwargs: Any,
) -> Any:
    """A dataclass field that enters the study identity (:class:`IdentityRule`); other
    keyword arguments go to :func:`dataclasses.field`."""
    metadata = {**field_kwargs.pop("metadata", {}), _IDENTITY: IdentityRule(key, omitted, nested)}
    return dataclasses.field(default=default, metadata=metadata, **field_kwargs)


def _rules(cls_or_value: Any) -> list[tuple[dataclasses.Field[Any], IdentityRule]]:
    return [(f, f.metadata[_IDENTITY]) for f in dataclasses.fields(cls_or_value) if _IDENTITY in f.metadata]


def identity_of(value: Any) -> dict[str, Any]:
    """The identity mapping of a dataclass ``value``: each identity field under its key, in
    field order, nested values' fields in place, fields at their ``omitted`` value left out.

    Raises:
        ValueError: two fields claim the same key.
    """
    out: dict[str, Any] = {}
    for f, rule in _rules(value):
        v = getattr(value, f.name)
        if rule.nested:
            part = identity_of(v)
        elif rule.omitted is not _NO_VALUE and v == rule.omitted:
            continue
        else:
            part = {rule.key or f.name: v}
        clash = sorted(set(part) & set(out))
        if clash:
            raise ValueError(f"identity key(s) {', '.join(clash)} declared twice in {type(value).__name__}")
        out.update(part)
    return out
