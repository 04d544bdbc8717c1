"""The mapping file's content: domain -> selected skip set, validated on the way in and out.

A mapping file serves one target model; each domain has one entry. See ``docs/mapping.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tss_opt.config.enums import Verification
from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC, OBJECTIVE_NAMES
from tss_opt.errors import TSSError

__all__ = [
    "DEFAULT_SCOPE",
    "FORMAT_VERSION",
    "SKIP_SCOPES",
    "DomainMapping",
    "MappingEntry",
    "MappingError",
    "OperatingPoint",
    "mapping_from_data",
]

FORMAT_VERSION = 1

# The skip scopes (tss_opt.config.enums.Scope): "verify" = dense prefill, sparse verification
# (the paper); "all" = sparse in every target forward. Kept as plain strings here so reading a
# mapping imports no torch.
SKIP_SCOPES = ("verify", "all")
# Entries written before the scope was recorded were all searched under the default scope.
DEFAULT_SCOPE = "verify"


class MappingError(TSSError):
    """A mapping file is missing, corrupt, invalid, or for another model."""


@dataclass(frozen=True)
class OperatingPoint:
    """One measured skip set: its layers and objectives."""

    skip_set: tuple[int, ...]
    accept_length: float
    metric: float
    cost: float
    sparsity: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "skip_set": list(self.skip_set),
            ACCEPT_LENGTH: self.accept_length,
            METRIC: self.metric,
            COST: self.cost,
            "sparsity": self.sparsity,
        }


@dataclass(frozen=True)
class MappingEntry:
    """The selected skip set of one domain and where it came from.

    Attributes:
        domain: The task domain (``qa``, ``translation``...).
        skip_set: S*, ascending layer indices (empty: run dense).
        accept_length, metric, cost: The objectives measured for S* on the calibration split.
        metric_name: The task metric's name (``f1``, ``bleu``...).
        sparsity: R = |S*| / L.
        baseline: The dense run's ``accept_length``, ``metric`` and ``cost``.
        model: The target model id.
        num_layers: L.
        drafter: The drafter used while searching (``None`` if unknown).
        study: ``{"name": ..., "storage": ...}`` (URL without password).
        selection: The selection rule (``min_cost`` or ``triple_win``).
        alternatives: The other Pareto points.
        split: The data split searched on (e.g. ``calibration``).
        calibration: S*'s search figures with their paired bounds: ``feasibility``,
            ``accept_length``, ``metric``, ``cost``, ``bounds`` (per quantity ``mean_diff``,
            ``lower``, ``upper``, ``tolerance``, ``n``). ``None`` in older files.
        validation: The validation outcome: ``chosen``, ``reason``, ``dense_kept``,
            ``confidence``, ``num_prompts``, ``dense`` and S*'s validation figures with bounds
            (``figures``). ``None`` when the choice was not validated (older files too).
        verification: The acceptance rule the study measured under: ``exact`` (lossless), or a
            lossy relaxed rule such as ``diversed(w=0.6)`` / ``cospec(...)``, whose
            ``metric`` is to be read beside ``baseline.metric``.
        relaxed: How to rebuild the lossy rule, and why it was chosen (``None`` for exact
            entries): ``mode`` (``diversed``/``cospec``) with its settings (``weight``,
            ``weight_policy``, ``policy``, ``tau_draft``/``tau_target``), and, when it was
            tuned as a second stage after the skip set (``python -m
            tss_opt.cli.tune_verification``), ``chosen``, ``skip_set``, ``calibration`` (the
            figures under that rule beside the dense exact run's, with the paired bound) and
            ``candidates``. The entry's own ``accept_length``/``metric`` stay the search's.
        scope: The skip scope the study searched (and the runtime serves) the entry with:
            ``verify`` (dense prefill, sparse verification) or ``all`` (sparse in every
            forward, prefill included: what a checkpoint with the layers deleted computes,
            ``tss_opt.mapping.checkpoint``). Entries written before the scope was recorded
            read as ``verify``.
        dtype: The floating-point type the study searched in (its protocol's ``dtype``:
            ``float32``, ``bfloat16``...). The skip set and its figures hold in that precision;
            the runtime logs a warning when it serves in another (other roundings flip
            argmax near-ties, so acceptance and outputs may differ). ``None`` in files written
            before it was recorded (those studies all searched in float32, the default then).
    """

    domain: str
    skip_set: tuple[int, ...]
    accept_length: float
    metric: float
    metric_name: str
    cost: float
    sparsity: float
    baseline: Mapping[str, float]
    model: str
    num_layers: int
    drafter: str | None
    study: Mapping[str, str]
    selection: str
    alternatives: tuple[OperatingPoint, ...] = ()
    split: str | None = None
    calibration: Mapping[str, Any] | None = None
    validation: Mapping[str, Any] | None = None
    verification: str = "exact"
    relaxed: Mapping[str, Any] | None = None
    scope: str = DEFAULT_SCOPE
    dtype: str | None = None

    @property
    def lossy(self) -> bool:
        """True when the entry was searched under a relaxed (lossy) verification rule."""
        return Verification.lossy_label(self.verification)

    @property
    def metric_change(self) -> float:
        """The metric under the entry's rule minus the dense (exact) baseline's: a tuned lossy
        rule's calibration figures when present, else the search's."""
        cal = (self.relaxed or {}).get("calibration") or {}
        if "metric_change" in cal:
            return float(cal["metric_change"])
        return self.metric - float(self.baseline.get("metric", self.metric))

    @property
    def skip(self) -> frozenset[int]:
        """S* as a frozenset, ready for the runtime."""
        return frozenset(self.skip_set)

    def to_dict(self) -> dict[str, Any]:
        """The YAML form of the entry (the domain is the key, not a field)."""
        data: dict[str, Any] = {
            "skip_set": list(self.skip_set),
            ACCEPT_LENGTH: self.accept_length,
            METRIC: self.metric,
            "metric_name": self.metric_name,
            COST: self.cost,
            "sparsity": self.sparsity,
            "baseline": dict(self.baseline),
            "model": self.model,
            "num_layers": self.num_layers,
            "drafter": self.drafter,
            "split": self.split,
            "study": dict(self.study),
            "selection": self.selection,
            "scope": self.scope,
            "alternatives": [a.to_dict() for a in self.alternatives],
        }
        # Written only when known, so entries of older searches round-trip unchanged.
        if self.calibration is not None:
            data["calibration"] = dict(self.calibration)
        if self.validation is not None:
            data["validation"] = dict(self.validation)
        if self.dtype is not None:
            data["dtype"] = self.dtype
        if self.lossy:  # exact entries stay as before; a lossy one says so
            data["verification"] = self.verification
            data["lossy"] = True
            data["metric_change"] = self.metric_change
            if self.relaxed is not None:
                data["relaxed"] = _plain(self.relaxed)
        return data


@dataclass(frozen=True)
class DomainMapping:
    """A whole mapping file: one model, one entry per domain.

    Attributes:
        model: The target model id all entries were searched on (``None`` when empty).
        num_layers: Its layer count (``None`` when empty).
        entries: Entries by domain.
        path: Where it was read from, if anywhere.
    """

    model: str | None = None
    num_layers: int | None = None
    entries: Mapping[str, MappingEntry] = field(default_factory=dict)
    path: Path | None = None

    @property
    def domains(self) -> list[str]:
        return sorted(self.entries)

    def entry_for(self, domain: str) -> MappingEntry | None:
        """The entry of ``domain``, or ``None`` (then the runtime runs dense)."""
        return self.entries.get(domain)

    def skip_set_for(self, domain: str) -> frozenset[int]:
        """S* of ``domain``; the empty set (dense) for an unknown domain."""
        entry = self.entries.get(domain)
        return entry.skip if entry is not None else frozenset()

    def check_model(self, model_id: str, num_layers: int) -> None:
        """Raise :class:`MappingError` unless the mapping was searched on this model.

        Raises:
            MappingError: The model id or the layer count differs.
        """
        where = f" in {self.path}" if self.path else ""
        if self.model is None:
            return
        if self.model != model_id or self.num_layers != num_layers:
            raise MappingError(
                f"The mapping{where} is for model '{self.model}' ({self.num_layers} layers), "
                f"but the loaded model is '{model_id}' ({num_layers} layers); its skip sets "
                "would skip the wrong layers. Use the mapping file searched on this model "
                "or run the search for it."
            )

    def precision_note(self, dtype: str) -> str | None:
        """Why serving in ``dtype`` may not reproduce the searched figures, or ``None``.

        A warning, not an error: the skip sets still apply, but their acceptance and metric
        were measured in the entries' recorded precision, and other roundings flip argmax
        near-ties (docs/engine.md, "Precision"). Entries that recorded no dtype are not
        compared (older files).
        """
        other = {d: e.dtype for d, e in sorted(self.entries.items()) if e.dtype is not None and e.dtype != dtype}
        if not other:
            return None
        where = f" {self.path}" if self.path else ""
        searched = ", ".join(f"{d} in {t}" for d, t in other.items())
        return (
            f"serving in {dtype} but the mapping{where} was searched {searched}: its accepted lengths and metrics "
            f"hold in that precision, and outputs near argmax ties may differ. Set dtype={next(iter(other.values()))} "
            "to serve in the searched precision, or search again in this one"
        )

    def with_entry(self, entry: MappingEntry) -> DomainMapping:
        """A copy with ``entry`` added or replaced (same model required)."""
        if self.model is not None and (
            entry.model != self.model or entry.num_layers != self.num_layers
        ):
            where = f" {self.path}" if self.path else ""
            raise MappingError(
                f"Cannot add domain '{entry.domain}' searched on '{entry.model}' "
                f"({entry.num_layers} layers) to the mapping{where} for '{self.model}' "
                f"({self.num_layers} layers); write it to another mapping file."
            )
        entries = dict(self.entries)
        entries[entry.domain] = entry
        return replace(self, model=entry.model, num_layers=entry.num_layers, entries=entries)

    def to_data(self) -> dict[str, Any]:
        """The YAML document."""
        return {
            "format": FORMAT_VERSION,
            "model": self.model,
            "num_layers": self.num_layers,
            "domains": {d: self.entries[d].to_dict() for d in sorted(self.entries)},
        }


def _plain(value: Any) -> Any:
    """Mappings and tuples as plain dicts and lists (what YAML's safe dumper writes)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


RELAXED_MODES = tuple(str(rule) for rule in Verification if rule.lossy)


def _relaxed(path: Path | None, where: str, value: Any, verification: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _err(path, where, f"expected a mapping, got {value!r}")
    if value.get("mode") not in RELAXED_MODES:
        raise _err(path, f"{where}.mode", f"expected one of {', '.join(RELAXED_MODES)}, got {value.get('mode')!r}")
    if not Verification.lossy_label(verification):
        raise _err(
            path, where,
            "a relaxed block in an entry whose verification is exact; set verification to the rule's label or drop the block",
        )
    w = value.get("weight")
    if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0):
        raise _err(path, f"{where}.weight", f"expected a DIVERSED weight in [0, 1], got {w!r}")
    return _plain(value)


def _err(path: Path | None, where: str, message: str) -> MappingError:
    at = f"{path}" if path else "mapping"
    return MappingError(f"{at}: {where}: {message}")


def _number(path: Path | None, where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _err(path, where, f"expected a finite number, got {value!r}")
    return float(value)


def _text(path: Path | None, where: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise _err(path, where, f"expected a non-empty string, got {value!r}")
    return value


def _layers(path: Path | None, where: str, value: Any, num_layers: int) -> tuple[int, ...]:
    if not isinstance(value, list) or any(
        isinstance(x, bool) or not isinstance(x, int) for x in value
    ):
        raise _err(path, where, f"expected a list of layer indices, got {value!r}")
    bad = [x for x in value if not 0 <= x < num_layers]
    if bad:
        raise _err(
            path,
            where,
            f"layer(s) {bad} outside [0, {num_layers}) for a {num_layers}-layer model; "
            "the entry was written for another model or edited by hand",
        )
    if len(set(value)) != len(value):
        raise _err(path, where, f"duplicate layers in {value}")
    return tuple(sorted(value))


def _objectives(path: Path | None, where: str, data: Mapping[str, Any]) -> dict[str, float]:
    """The three objectives of a point, an entry or its baseline, each a finite number."""
    return {k: _number(path, f"{where}.{k}", data.get(k)) for k in OBJECTIVE_NAMES}


def _point(path: Path | None, where: str, data: Any, num_layers: int) -> OperatingPoint:
    if not isinstance(data, Mapping):
        raise _err(path, where, f"expected a mapping, got {type(data).__name__}")
    skip = _layers(path, f"{where}.skip_set", data.get("skip_set"), num_layers)
    return OperatingPoint(
        skip_set=skip,
        **_objectives(path, where, data),
        sparsity=_number(path, f"{where}.sparsity", data.get("sparsity", len(skip) / num_layers)),
    )


def _entry(path: Path | None, domain: str, data: Any, model: str, num_layers: int) -> MappingEntry:
    where = f"domains.{domain}"
    if not isinstance(data, Mapping):
        raise _err(path, where, f"expected a mapping, got {type(data).__name__}")
    if data.get("model", model) != model or data.get("num_layers", num_layers) != num_layers:
        raise _err(
            path,
            where,
            f"entry is for model {data.get('model')!r} ({data.get('num_layers')} layers) but "
            f"the file is for {model!r} ({num_layers} layers)",
        )
    baseline = data.get("baseline")
    if not isinstance(baseline, Mapping):
        raise _err(path, f"{where}.baseline", f"expected a mapping, got {baseline!r}")
    study = data.get("study") or {}
    if not isinstance(study, Mapping):
        raise _err(path, f"{where}.study", f"expected a mapping, got {study!r}")
    alternatives = data.get("alternatives") or []
    if not isinstance(alternatives, list):
        raise _err(path, f"{where}.alternatives", f"expected a list, got {alternatives!r}")
    skip = _layers(path, f"{where}.skip_set", data.get("skip_set"), num_layers)
    verification = _text(path, f"{where}.verification", data.get("verification", "exact")) or "exact"
    scope = data.get("scope", DEFAULT_SCOPE)
    if scope not in SKIP_SCOPES:
        raise _err(
            path, f"{where}.scope",
            f"expected one of {', '.join(SKIP_SCOPES)} (the skip scope the study searched with), got {scope!r}",
        )
    extra: dict[str, Mapping[str, Any] | None] = {}
    for key in ("calibration", "validation"):
        value = data.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise _err(path, f"{where}.{key}", f"expected a mapping, got {value!r}")
        extra[key] = dict(value) if value is not None else None
    return MappingEntry(
        domain=domain,
        skip_set=skip,
        **_objectives(path, where, data),
        metric_name=_text(path, f"{where}.metric_name", data.get("metric_name", METRIC)) or "",
        sparsity=_number(path, f"{where}.sparsity", data.get("sparsity", len(skip) / num_layers)),
        baseline=_objectives(path, f"{where}.baseline", baseline),
        model=model,
        num_layers=num_layers,
        drafter=_text(path, f"{where}.drafter", data.get("drafter"), optional=True),
        study={str(k): str(v) for k, v in study.items()},
        selection=_text(path, f"{where}.selection", data.get("selection", "min_cost")) or "",
        alternatives=tuple(
            _point(path, f"{where}.alternatives[{i}]", a, num_layers)
            for i, a in enumerate(alternatives)
        ),
        split=_text(path, f"{where}.split", data.get("split"), optional=True),
        calibration=extra["calibration"],
        validation=extra["validation"],
        verification=verification,
        relaxed=_relaxed(path, f"{where}.relaxed", data.get("relaxed"), verification),
        scope=scope,
        dtype=_text(path, f"{where}.dtype", data.get("dtype"), optional=True),
    )


def mapping_from_data(data: Any, path: Path | None = None) -> DomainMapping:
    """Validate a parsed YAML document and build the :class:`DomainMapping`.

    Raises:
        MappingError: Naming the file, the field and what was expected.
    """
    if not isinstance(data, Mapping):
        raise _err(path, "top level", f"expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - {"format", "model", "num_layers", "domains"})
    if unknown or "domains" not in data:
        # Not a mapping file (a model config, say): refuse rather than read it as empty.
        raise _err(
            path,
            "top level",
            f"expected the keys format, model, num_layers, domains; found {sorted(map(str, data))}",
        )
    fmt = data.get("format", FORMAT_VERSION)
    if fmt != FORMAT_VERSION:
        raise _err(path, "format", f"unsupported version {fmt!r}; this code reads {FORMAT_VERSION}")
    domains = data.get("domains") or {}
    if not isinstance(domains, Mapping):
        raise _err(path, "domains", f"expected a mapping of domain -> entry, got {domains!r}")
    if not domains:
        return DomainMapping(path=path)
    model = _text(path, "model", data.get("model")) or ""
    num_layers = data.get("num_layers")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise _err(path, "num_layers", f"expected an integer >= 1, got {num_layers!r}")
    entries: dict[str, MappingEntry] = {}
    for domain, entry in domains.items():
        if not isinstance(domain, str) or not domain:
            raise _err(path, "domains", f"domain names must be non-empty strings, got {domain!r}")
        entries[domain] = _entry(path, domain, entry, model, num_layers)
    return DomainMapping(model=model, num_layers=num_layers, entries=entries, path=path)
