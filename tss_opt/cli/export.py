"""``python -m tss_opt.cli.export +domain=NAME [same overrides as the search]`` (or
``study_name=...``): write the domain-to-skip-set mapping of a finished study."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from tss_opt.assembly import study_identity
from tss_opt.cli.common import hydra_entry
from tss_opt.errors import UsageError


def export(cfg: DictConfig) -> None:
    from tss_opt.mapping import export_mapping

    name, metadata = study_identity(cfg)
    try:
        entry = export_mapping(cfg.storage, name, cfg.mapping_path, domain=metadata["domain"])
    except KeyError as e:  # optuna says only "Record does not exist."
        raise UsageError(no_such_study(cfg.storage, name, metadata["domain"])) from e
    print(f"{cfg.mapping_path}: {metadata['domain']} -> skip {sorted(entry.skip_set)} (study {name})")


def no_such_study(storage: str | None, name: str, domain: str) -> str:
    """Say that study ``name`` is missing and list the studies of ``domain`` with the
    overrides that select each."""
    import optuna

    from tss_opt.storage import open_storage, storage_url

    opened = open_storage(storage, heartbeat_interval=None, grace_period=None)
    found = []
    for s in optuna.get_all_study_summaries(opened, include_best_trial=False):
        meta = s.user_attrs.get("metadata") or {}
        if meta.get("domain") == domain:
            found.append(f"study_name={s.study_name} ({_describe(meta)})")
    where = storage_url(storage)
    if not found:
        return (
            f"no study {name!r} in {where}, and no study of domain {domain!r} there; run the search "
            f"first (python -m tss_opt +domain={domain} ...) or pass the storage it used (storage=URL or TSS_STORAGE)"
        )
    return (
        f"no study {name!r} in {where}: the overrides differ from the search's (model, drafter, "
        f"search preset, prompts, max_new_tokens, split, scope, cost, temperature, dtype all name "
        f"the study). Studies of domain {domain!r} there: " + "; ".join(found)
        + ". Add the matching study_name=... (or the same overrides as that search)"
    )


def _describe(meta: dict[str, Any]) -> str:
    proto = meta.get("protocol") or {}
    parts = [
        f"+model={meta.get('model_name', '?')}",
        f"drafter={meta.get('drafter', '?')}",
        f"search={meta.get('preset', '?')}",
        f"split={meta.get('split', '?')}",
    ]
    parts += [f"{'search.prompts' if k == 'prompts' else k}={v}" for k, v in proto.items() if k != "split"]
    return " ".join(parts)


main = hydra_entry(export)

if __name__ == "__main__":
    main()
