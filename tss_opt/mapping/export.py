"""Export a finished search study into the mapping file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import optuna

from tss_opt.config.enums import Verification
from tss_opt.config.objectives import OBJECTIVE_NAMES
from tss_opt.mapping.format import DEFAULT_SCOPE, MappingEntry, MappingError, OperatingPoint
from tss_opt.mapping.io import DEFAULT_MAPPING_PATH, write_entry
from tss_opt.search.algorithm import canonical
from tss_opt.search.result import SearchResult, TrialRecord
from tss_opt.search.stored import load_result
from tss_opt.storage import open_storage, storage_url

__all__ = ["entry_from_result", "export_mapping"]


def _point(record: TrialRecord, num_layers: int) -> OperatingPoint:
    assert (
        record.accept_length is not None and record.metric is not None and record.cost is not None
    )
    return OperatingPoint(
        skip_set=canonical(record.skip_set),
        accept_length=record.accept_length,
        metric=record.metric,
        cost=record.cost,
        sparsity=len(record.skip_set) / num_layers,
    )


def entry_from_result(
    result: SearchResult,
    *,
    domain: str,
    model: str,
    drafter: str | None = None,
    split: str | None = None,
    storage: str = "",
    validation: Mapping[str, Any] | None = None,
    verification: str = "exact",
    relaxed: Mapping[str, Any] | None = None,
    scope: str = DEFAULT_SCOPE,
    dtype: str | None = None,
) -> MappingEntry:
    """Build the mapping entry of a finished :class:`~tss_opt.search.SearchResult`.

    Args:
        verification: The rule the study measured under (its protocol's label).
        relaxed: That rule's settings (the study metadata's ``relaxed``), for lossy studies.
        scope: The skip scope the study searched with (its protocol's ``scope``): ``verify``
            or ``all``; the runtime serves the entry with it.
        dtype: The precision the study searched in (its protocol's ``dtype``); ``None``:
            not recorded.
        validation: A validation outcome (``ValidationOutcome.to_dict()``, the study's
            ``validation`` user attribute). When given, its ``chosen`` set (or dense) is the
            entry's skip set instead of the search's S*, and the entry records the
            calibration and validation figures with their bounds.

    Raises:
        MappingError: The search is not finished, or the validated set was not evaluated.
    """
    if not result.finished:
        done = ", ".join(f"level {lv.level}: {lv.evaluated}/{lv.total}" for lv in result.levels)
        raise MappingError(
            f"Study '{result.study_name}' is not finished ({done}); run the search to the end "
            "(run_search resumes it) before exporting."
        )
    chosen = result.best
    if validation is not None:
        chosen = frozenset(validation.get("chosen") or ())
    try:
        record = result.record(chosen)
    except KeyError as e:
        raise MappingError(
            f"The validated choice {sorted(chosen)} was not evaluated in study "
            f"'{result.study_name}'; re-run the validation on this study."
        ) from e
    best = _point(record, result.num_layers)
    base = result.baseline
    calibration: dict[str, Any] | None = None
    if result.settings is not None:
        calibration = {
            "feasibility": result.feasibility_rule,
            "confidence": result.settings.confidence,
            **record.objectives(),
            "bounds": dict(record.bounds),
        }
    val: dict[str, Any] | None = None
    if validation is not None:
        checked = next(
            (c for c in validation.get("candidates", []) if frozenset(c.get("skip_set", [])) == chosen),
            None,
        )
        val = {
            k: validation.get(k)
            for k in ("chosen", "reason", "dense_kept", "confidence", "num_prompts", "dense")
        }
        val["figures"] = checked.get("validation") if checked else None
        val["candidates"] = [
            {k: c.get(k) for k in ("skip_set", "passed", "reason")}
            for c in validation.get("candidates", [])
        ]
    return MappingEntry(
        domain=domain,
        skip_set=best.skip_set,
        accept_length=best.accept_length,
        metric=best.metric,
        metric_name=result.metric_name,
        cost=best.cost,
        sparsity=best.sparsity,
        baseline={k: float(base[k]) for k in OBJECTIVE_NAMES},
        model=model,
        num_layers=result.num_layers,
        drafter=drafter,
        study={"name": result.study_name, "storage": storage},
        selection=result.selection,
        alternatives=tuple(
            _point(result.record(c), result.num_layers) for c in result.pareto if c != chosen
        ),
        split=split,
        calibration=calibration,
        validation=val,
        verification=verification,
        relaxed=dict(relaxed) if relaxed is not None and Verification.lossy_label(verification) else None,
        scope=scope,
        dtype=dtype,
    )


def export_mapping(
    storage: str | optuna.storages.BaseStorage | None,
    study_name: str,
    path: str | os.PathLike[str] = DEFAULT_MAPPING_PATH,
    domain: str | None = None,
) -> MappingEntry:
    """Write the selected skip set of a finished study into the mapping file at ``path``.

    The other domains in the file are kept. Model, drafter, domain and split come from the
    study's ``metadata`` (given to ``run_search``). When the study carries a ``validation``
    user attribute (:func:`tss_opt.search.validation.validate_candidates`), its choice is
    written (dense when nothing passed) with calibration and validation figures.

    Args:
        storage: A URL (``None``: the default SQLite file) or an Optuna storage.
        study_name: The finished study.
        path: The mapping file (default ``storage/mapping.yaml``).
        domain: The domain to write; default: the study's ``metadata["domain"]``.

    Returns:
        The entry written.

    Raises:
        MappingError: Unfinished study, missing domain/model metadata, a corrupt or
            other-model mapping file.
    """
    if storage is None or isinstance(storage, str):
        storage = open_storage(storage, heartbeat_interval=None, grace_period=None)
    result = load_result(storage, study_name)
    attrs = optuna.load_study(study_name=study_name, storage=storage).user_attrs
    metadata: dict[str, Any] = attrs.get("metadata", {})
    domain = domain or metadata.get("domain")
    if not domain:
        raise MappingError(
            f"Study '{study_name}' has no metadata['domain']; pass domain=... to export_mapping."
        )
    model = metadata.get("model")
    if not model:
        raise MappingError(
            f"Study '{study_name}' has no metadata['model']; run_search(..., "
            "metadata={'model': <model id>, ...}) records it, and the mapping needs it to "
            "refuse a different model at run time."
        )
    entry = entry_from_result(
        result,
        domain=str(domain),
        model=str(model),
        drafter=metadata.get("drafter"),
        split=metadata.get("split"),
        storage=storage_url(storage),
        validation=attrs.get("validation"),
        verification=str((metadata.get("protocol") or {}).get("verification", "exact")),
        relaxed=metadata.get("relaxed"),  # a search under a lossy rule: its settings (study_identity)
        # The scope the trials measured under; studies from before it was recorded: verify.
        scope=str((metadata.get("protocol") or {}).get("scope", DEFAULT_SCOPE)),
        # The precision the trials ran in: the runtime warns when it serves in another.
        dtype=(metadata.get("protocol") or {}).get("dtype"),
    )
    write_entry(path, entry)
    return entry
