"""A study's identity: what it measures, and the check that a resume measures the same.

Two things name a study and must not change when it is resumed or joined:

- the **search settings** that decide which configurations are evaluated
  (:data:`IDENTITY_FIELDS`, hashed by :func:`settings_hash` into the study name);
- the **protocol**, what one trial measures (prompts, tokens, split, scope, cost,
  temperature, dtype...: ``metadata["protocol"]``, hashed by :func:`protocol_hash`; the
  commands derive it from one frozen value whose fields declare their keys, the evaluation
  layer's ``StudyProtocol``), and the identity metadata (model, layer count, drafter, domain, split).

:func:`study_name_for` builds ``<domain>.<model>.<drafter>.<split>.s<settings hash>``; the
commands append ``.p<protocol hash>``. :func:`check_same_search` is applied by
:func:`tss_opt.search.run_search` itself when it loads a stored study, so Python-API users get
the same refusal (with every difference listed) as the commands.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tss_opt.config.search import IDENTITY_FIELDS, LEGACY_IDENTITY, SearchSettings
from tss_opt.errors import TSSError
from tss_opt.storage import storage_url

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.study import StudyDirection

    from tss_opt.search.contract import EvaluatorInfo

__all__ = [
    "IDENTITY_FIELDS",
    "IDENTITY_METADATA",
    "StudyMismatchError",
    "check_directions",
    "check_same_search",
    "check_stored_study",
    "identity_differences",
    "protocol_hash",
    "settings_hash",
    "study_name_for",
]

# Metadata keys that identify what a study measures; a resume must not change them.
IDENTITY_METADATA = ("model", "num_layers", "drafter", "domain", "split")


class StudyMismatchError(TSSError):
    """An existing study was created with different settings, model or objectives."""


def settings_hash(settings: SearchSettings | Mapping[str, Any] | None, length: int = 7) -> str:
    """A short stable hash of the identity settings (hex digits)."""
    if settings is None:
        settings = SearchSettings()
    if isinstance(settings, Mapping):
        settings = SearchSettings.from_mapping(settings)
    blob = json.dumps(settings.identity(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:length]


def str_value(value: Any) -> Any:
    """Enum members as their plain values (for messages and stored JSON)."""
    return getattr(value, "value", value)


def protocol_hash(protocol: Mapping[str, Any], length: int = 5) -> str:
    """A short stable hash of a protocol mapping (hex digits)."""
    blob = json.dumps(dict(protocol), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:length]


def _slug(value: Any) -> str:
    text = str(value).strip().rstrip("/").split("/")[-1].lower()
    text = re.sub(r"[^a-z0-9]+", "_", text).strip("_")
    return text or "x"


def study_name_for(
    *,
    domain: str,
    model: str,
    drafter: str,
    split: str = "calibration",
    settings: SearchSettings | Mapping[str, Any] | None = None,
) -> str:
    """A stable, readable study name: ``<domain>.<model>.<drafter>.<split>.s<hash>``.

    The model id keeps only its last path part (``HuggingFaceTB/SmolLM2-135M-Instruct`` ->
    ``smollm2_135m_instruct``); the hash covers the settings that decide which configurations
    are evaluated (not ``selection``), so changing them gives a new study.

    Example:
        ``study_name_for(domain="qa", model="smollm2-135m", drafter="pld",
        split="calibration")`` -> ``"qa.smollm2_135m.pld.calibration.s<7 hex digits>"``.
    """
    parts = [_slug(domain), _slug(model), _slug(drafter), _slug(split)]
    return ".".join(parts) + ".s" + settings_hash(settings)


def how_to_fix(study_name: str, storage: BaseStorage) -> str:
    return (
        "To keep the stored study, re-run with its settings. To start a new search, pass "
        "another study_name (tss_opt.search.study_name_for(...) derives one from the settings) "
        f"or delete this one: optuna delete-study --study-name {study_name} "
        f"--storage {storage_url(storage)}"
    )


def check_directions(
    study: optuna.Study,
    directions: list[StudyDirection],
    study_name: str,
    storage: BaseStorage,
) -> None:
    # create_study(load_if_exists=True) silently keeps the stored directions.
    if list(study.directions) != directions:
        stored = [d.name.lower() for d in study.directions]
        wanted = [d.name.lower() for d in directions]
        raise StudyMismatchError(
            f"Study '{study_name}' has directions {stored}, but this search needs {wanted} "
            "(accept_length, metric, cost). " + how_to_fix(study_name, storage)
        )


def identity_differences(
    attrs: Mapping[str, Any],
    settings: SearchSettings,
    meta: Mapping[str, Any],
    info: EvaluatorInfo | None = None,
) -> list[str]:
    """Every way a stored study (its user attributes) differs from the requested search.

    Compared: the identity settings, the evaluator's layer count and metric (when ``info`` is
    given), the identity metadata and each protocol key present on both sides.
    """
    diffs: list[str] = []
    stored = attrs.get("search_settings", {})
    for name in settings.identity():
        # A field the stored settings lack (a study made before it existed) counts as its
        # legacy value: such a study was searched under the point rule, without early stops.
        if name in stored:
            value = stored[name]
        elif name in LEGACY_IDENTITY:
            value = LEGACY_IDENTITY[name]
        else:
            continue
        if value != getattr(settings, name):
            diffs.append(f"{name}: stored {value!r}, requested {str_value(getattr(settings, name))!r}")
    if info is not None:
        for key, value in (
            ("num_layers", info.num_layers),
            ("metric_name", info.metric_name),
            ("metric_higher_is_better", info.metric_higher_is_better),
        ):
            if attrs.get(key) != value:
                diffs.append(f"{key}: stored {attrs.get(key)!r}, requested {value!r}")
    stored_meta = attrs.get("metadata", {})
    for key in IDENTITY_METADATA:
        if key in stored_meta and key in meta and stored_meta[key] != meta[key]:
            diffs.append(f"metadata.{key}: stored {stored_meta[key]!r}, requested {meta[key]!r}")
    old, new = stored_meta.get("protocol") or {}, meta.get("protocol") or {}
    for key in sorted(set(old) & set(new)):
        if old[key] != new[key]:
            diffs.append(f"protocol.{key}: stored {old[key]!r}, requested {new[key]!r}")
    return diffs


def _raise_if(diffs: list[str], study_name: str, storage: BaseStorage) -> None:
    if diffs:
        raise StudyMismatchError(
            f"Study '{study_name}' in {storage_url(storage)} was created with different "
            f"settings: {'; '.join(diffs)}. " + how_to_fix(study_name, storage)
        )


def check_same_search(
    study: optuna.Study,
    study_name: str,
    storage: BaseStorage,
    info: EvaluatorInfo,
    settings: SearchSettings,
    meta: Mapping[str, Any],
) -> None:
    """Refuse to resume ``study`` under another identity (every difference listed).

    Raises:
        StudyMismatchError: Settings, evaluator, identity metadata or protocol differ.
    """
    _raise_if(identity_differences(study.user_attrs, settings, meta, info), study_name, storage)


def check_stored_study(
    storage: BaseStorage,
    study_name: str,
    settings: SearchSettings,
    meta: Mapping[str, Any],
) -> None:
    """The same check before anything is loaded: a study not stored yet passes.

    Raises:
        StudyMismatchError: The stored study has another identity.
    """
    import optuna

    try:
        attrs = optuna.load_study(study_name=study_name, storage=storage).user_attrs
    except KeyError:
        return  # a new study
    _raise_if(identity_differences(attrs, settings, meta), study_name, storage)
