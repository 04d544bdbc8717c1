"""``python -m tss_opt.cli.export_model +domain=NAME out=DIR [format=hf|gguf] [outtype=f32|f16|bf16|q8_0]
[gguf_source=FILE] [mapping_path=...] [force=true]``

Writes the domain's sparse target with the mapping entry's layers deleted, the rest renumbered:

- ``format=hf`` (the default): a plain Hugging Face checkpoint folder (safetensors, config,
  tokenizer, generation config) for transformers or any engine that runs the original
  architecture (vLLM, SGLang...). Library code: :mod:`tss_opt.mapping.checkpoint`.
- ``format=gguf``: one file ``DIR/<model>-<domain>.gguf`` (tensors ``outtype``, default f32)
  for llama.cpp, Ollama, LM Studio, cut from the model's dense GGUF (the embedded model's own
  file, or ``gguf_source=``), with a model card ``DIR/<model>-<domain>.md`` beside it. Library
  code: :mod:`tss_opt.mapping.gguf_export`.

docs/mapping.md, "Exporting a domain's checkpoint". Only an entry searched with ``scope=all``
equals the served target; a ``scope=verify`` entry is refused unless ``force=true``.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from tss_opt.cli.common import hydra_entry
from tss_opt.errors import UsageError
from tss_opt.mapping.checkpoint import ExportSummary
from tss_opt.mapping.gguf_export import GGUFExportSummary

log = logging.getLogger(__name__)


def export_model(cfg: DictConfig) -> ExportSummary:
    from tss_opt.assembly import model_config
    from tss_opt.config.enums import ExportFormat, GGUFOutType
    from tss_opt.mapping import load_mapping
    from tss_opt.mapping.checkpoint import (
        check_exportable,
        check_out_dir,
        entry_to_export,
        export_domain_checkpoint,
    )
    from tss_opt.mapping.gguf_export import check_gguf_out, export_domain_gguf, source_gguf_path
    from tss_opt.models import as_model_config, load_model, model_id_for, resolve_model_dtype

    if cfg.get("domain") is None:
        from tss_opt.config.search_path import domain_config_dirs
        from tss_opt.evaluation.domains import available_domains

        names = ", ".join(available_domains(domain_config_dirs()))
        raise UsageError(f"no domain chosen; add +domain=NAME, the mapping entry to export (available: {names})")
    domain = str(cfg.domain.name)
    force = bool(cfg.get("force", False))
    fmt = ExportFormat.parse("format", cfg.get("format") or ExportFormat.hf)
    if fmt is ExportFormat.hf:
        for key in ("outtype", "gguf_source"):
            if cfg.get(key) is not None:
                raise UsageError(f"{key}={cfg.get(key)} applies to format=gguf only; add format=gguf or drop {key}=")
    # Everything that can be refused is checked before the model (or the GGUF) is read.
    # A checkpoint keeps the precision the mapping was searched in: dtype=auto resolves as a
    # search does (float32 on CPU), not to the fastest decoding precision.
    mc = resolve_model_dtype(as_model_config(model_config(cfg)), "search")
    if fmt is ExportFormat.gguf:
        check_gguf_out(cfg.get("out"), mc.name, domain)
    else:
        out = check_out_dir(cfg.get("out"))
    mapping = load_mapping(cfg.mapping_path)
    model_id = model_id_for(mc)
    mapping.check_model(model_id, mc.num_layers)
    entry = entry_to_export(mapping, domain)
    check_exportable(entry, force=force)
    if fmt is ExportFormat.gguf:
        source = source_gguf_path(mc, cfg.get("gguf_source"))
        summary = export_domain_gguf(
            source, mapping, domain, cfg.out, model_name=mc.name, model_id=model_id, num_layers=mc.num_layers,
            outtype=GGUFOutType.parse("outtype", cfg.get("outtype") or GGUFOutType.f32), force=force,
            progress=log.info,
        )
    else:
        loaded = load_model(mc)
        summary = export_domain_checkpoint(
            loaded.model, loaded.tokenizer, mapping, domain, out,
            model_id=loaded.model_id, layers_path=mc.layers_path, force=force,
        )
    what = "file" if fmt is ExportFormat.gguf else "checkpoint"
    if summary.dense:
        print(
            f"note: domain {domain!r} has an empty skip set in {cfg.mapping_path} (the search kept the dense target); "
            f"the {what} is the unchanged {summary.layers}-layer model, which is what the runtime serves it with"
        )
    if summary.forced:
        print(
            f"warning: force=true: {domain!r} was searched with scope=verify (dense prefill); this {what} skips "
            "its layers in the prefill too, so its outputs differ from the served target's"
        )
    if entry.lossy:
        print(
            f"note: {domain!r} is served under the lossy rule {entry.verification}; an engine verifying exactly "
            f"emits this {what}'s own greedy tokens instead"
        )
    skipped = ", ".join(map(str, summary.skip_set)) or "none"
    print(
        f"{summary.out}: {domain} -> {summary.layers} of {summary.source_layers} layers "
        f"(deleted: {skipped}; scope {summary.scope}) from {summary.source_model}"
    )
    if isinstance(summary, GGUFExportSummary):
        print(f"{summary.card}: model card ({summary.outtype} tensors; run it with llama-cli -m {summary.out})")
    return summary


main = hydra_entry(export_model)

if __name__ == "__main__":
    main()
