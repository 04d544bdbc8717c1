"""``python -m tss_opt.cli.export +domain=NAME [same overrides as the search]`` (or
``study_name=...``): write the domain-to-skip-set mapping of a finished study."""

from __future__ import annotations

from omegaconf import DictConfig

from tss_opt.assembly import study_identity
from tss_opt.cli.common import hydra_entry


def export(cfg: DictConfig) -> None:
    from tss_opt.mapping import export_mapping

    name, metadata = study_identity(cfg)
    entry = export_mapping(cfg.storage, name, cfg.mapping_path, domain=metadata["domain"])
    print(f"{cfg.mapping_path}: {metadata['domain']} -> skip {sorted(entry.skip_set)} (study {name})")


main = hydra_entry(export)

if __name__ == "__main__":
    main()
