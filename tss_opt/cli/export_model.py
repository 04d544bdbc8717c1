"""``python -m tss_opt.cli.export_model +domain=NAME out=DIR [mapping_path=...] [force=true]``

Writes the domain's sparse target as a plain Hugging Face checkpoint (safetensors, config,
tokenizer, generation config): the mapping entry's layers deleted, the rest renumbered. Serve
it with transformers or any engine that runs the original architecture (vLLM, SGLang...;
docs/mapping.md, "Exporting a domain's checkpoint"). Only an entry searched with
``scope=all`` equals the served target; a ``scope=verify`` entry is refused unless
``force=true``. Library code: :mod:`tss_opt.mapping.checkpoint`.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from tss_opt.cli.common import hydra_entry
from tss_opt.errors import UsageError
from tss_opt.mapping.checkpoint import ExportSummary

log = logging.getLogger(__name__)


def export_model(cfg: DictConfig) -> ExportSummary:
    from tss_opt.assembly import model_config
    from tss_opt.mapping import load_mapping
    from tss_opt.mapping.checkpoint import (
        check_exportable,
        check_out_dir,
        entry_to_export,
        export_domain_checkpoint,
    )
    from tss_opt.models import as_model_config, load_model, model_id_for

    if cfg.get("domain") is None:
        from tss_opt.config.search_path import domain_config_dirs
        from tss_opt.evaluation.domains import available_domains

        names = ", ".join(available_domains(domain_config_dirs()))
        raise UsageError(f"no domain chosen; add +domain=NAME, the mapping entry to export (available: {names})")
    domain = str(cfg.domain.name)
    force = bool(cfg.get("force", False))
    # Everything that can be refused is checked before the model is loaded (seconds to minutes).
    out = check_out_dir(cfg.get("out"))
    mapping = load_mapping(cfg.mapping_path)
    mc = as_model_config(model_config(cfg))
    model_id = model_id_for(mc)
    mapping.check_model(model_id, mc.num_layers)
    entry = entry_to_export(mapping, domain)
    check_exportable(entry, force=force)
    loaded = load_model(mc)
    summary = export_domain_checkpoint(
        loaded.model, loaded.tokenizer, mapping, domain, out,
        model_id=loaded.model_id, layers_path=mc.layers_path, force=force,
    )
    if summary.dense:
        print(
            f"note: domain {domain!r} has an empty skip set in {cfg.mapping_path} (the search kept the dense target); "
            f"the checkpoint is the unchanged {summary.layers}-layer model, which is what the runtime serves it with"
        )
    if summary.forced:
        print(
            f"warning: force=true: {domain!r} was searched with scope=verify (dense prefill); this checkpoint skips "
            "its layers in the prefill too, so its outputs differ from the served target's"
        )
    if entry.lossy:
        print(
            f"note: {domain!r} is served under the lossy rule {entry.verification}; an engine verifying exactly "
            "emits this checkpoint's own greedy tokens instead"
        )
    skipped = ", ".join(map(str, summary.skip_set)) or "none"
    print(
        f"{summary.out}: {domain} -> {summary.layers} of {summary.source_layers} layers "
        f"(deleted: {skipped}; scope {summary.scope}) from {summary.source_model}"
    )
    return summary


main = hydra_entry(export_model)

if __name__ == "__main__":
    main()
