"""A domain's sparse target as a plain Hugging Face checkpoint: its mapped layers deleted.

No serving engine skips layers per request (vLLM, SGLang, TensorRT-LLM, llama.cpp: none), so
for their users the domain's skip set is baked into a shorter model: the layers of S* are
removed from the decoder, the rest renumbered (each layer's ``layer_idx``, which indexes the
KV cache and per-layer settings), and the config's ``num_hidden_layers`` and every per-layer
list (``layer_types``...) cut to match. The result loads with
``AutoModelForCausalLM.from_pretrained(out)`` and runs in any engine that runs the original
architecture.

It equals the served target only for an entry of scope ``all`` (sparse in every forward):
under scope ``verify`` the runtime prefills densely, which a model without the layers cannot
do, so such an entry is refused unless forced (:func:`check_exportable`). A dense entry (empty
skip set) exports the unchanged model: that is what the runtime serves its domain with.

The layer surgery changes the model in place: export from a freshly loaded model, never from
one that is serving requests (the skip mechanism's controller, if attached, is dropped).
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC
from tss_opt.errors import TSSError
from tss_opt.mapping.format import DomainMapping, MappingEntry

__all__ = [
    "EXPORT_INFO_FILE",
    "CheckpointError",
    "ExportSummary",
    "check_exportable",
    "check_out_dir",
    "delete_layers",
    "kept_layers",
    "entry_to_export",
    "export_domain_checkpoint",
    "export_info",
    "save_checkpoint",
]

# Provenance written next to the weights (domain, skip set, source model, scope).
EXPORT_INFO_FILE = "tss_export.json"

# Config lists that are not per-layer even when their length happens to equal the layer count
# (token ids, label maps, architecture names).
NOT_PER_LAYER = frozenset({
    "architectures", "eos_token_id", "bos_token_id", "pad_token_id", "bad_words_ids", "suppress_tokens",
    "begin_suppress_tokens", "forced_decoder_ids", "id2label", "label2id", "prune_heads",
})

# The skip mechanism attaches its controller to the model under this attribute
# (tss_opt.decoding.skip); it holds the old layer list, so it goes with the surgery.
_SKIP_CONTROLLER_ATTR = "_tss_skip_controller"


class CheckpointError(TSSError):
    """A sparse checkpoint cannot be exported as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ExportSummary:
    """What :func:`export_domain_checkpoint` wrote.

    Attributes:
        out: The checkpoint folder.
        domain: The exported domain.
        skip_set: The deleted layers (indices of the source model), ascending.
        source_model: The source model's id (the mapping's).
        source_layers: Its layer count.
        layers: The exported model's layer count.
        scope: The entry's skip scope.
        forced: Exported despite scope ``verify`` (``force=true``): it does not equal the
            served target.
        dense: The entry's skip set is empty: the model was exported unchanged.
    """

    out: str
    domain: str
    skip_set: tuple[int, ...]
    source_model: str
    source_layers: int
    layers: int
    scope: str
    forced: bool
    dense: bool

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["skip_set"] = list(self.skip_set)
        return data


def summary_fields(
    out: str | os.PathLike[str], domain: str, entry: Any, model_id: str, num_layers: int, layers: int, force: bool
) -> dict[str, Any]:
    """The fields every export's summary shares (the Hugging Face checkpoint's and the GGUF's)."""
    return {
        "out": str(out),
        "domain": domain,
        "skip_set": tuple(entry.skip_set),
        "source_model": model_id,
        "source_layers": num_layers,
        "layers": layers,
        "scope": entry.scope,
        "forced": bool(force and entry.scope != "all" and entry.skip_set),
        "dense": not entry.skip_set,
    }


def entry_to_export(mapping: DomainMapping, domain: str) -> MappingEntry:
    """The mapping entry of ``domain``.

    Raises:
        CheckpointError: The mapping has no entry for it (the mapped domains are listed).
    """
    entry = mapping.entry_for(domain)
    if entry is None:
        where = f" {mapping.path}" if mapping.path else ""
        raise CheckpointError(
            f"no entry for domain {domain!r} in the mapping{where} (mapped: {', '.join(mapping.domains) or 'none'}); "
            f"search it with scope=all (python -m tss_opt +domain={domain} scope=all), export the study "
            f"(python -m tss_opt.cli.export +domain={domain} scope=all), or point mapping_path= at the right file"
        )
    return entry


def check_exportable(entry: MappingEntry, *, force: bool = False) -> None:
    """Refuse an entry whose checkpoint would not equal the served target.

    A checkpoint without S*'s layers is sparse in every forward, prompt included: scope
    ``all``. An entry searched with scope ``verify`` (dense prefill) was measured, and is
    served, with the prompt run through every layer. A dense entry is the same in both scopes.

    Raises:
        CheckpointError: Scope ``verify`` with a non-empty skip set and ``force`` false.
    """
    if entry.scope == "all" or not entry.skip_set or force:
        return
    raise CheckpointError(
        f"domain {entry.domain!r} was searched with scope=verify (dense prefill, sparse verification), but a "
        f"checkpoint without layers {list(entry.skip_set)} skips them in the prefill too, so it would not equal "
        f"what was searched and served; search with scope=all (python -m tss_opt +domain={entry.domain} scope=all, "
        f"then python -m tss_opt.cli.export +domain={entry.domain} scope=all) or pass force=true to export it anyway"
    )


def check_out_dir(out: str | os.PathLike[str] | None) -> Path:
    """The checkpoint folder: new or empty (checked before any model is loaded).

    Raises:
        CheckpointError: No folder given, a file, or a folder with files in it.
    """
    if out is None or not str(out).strip():
        raise CheckpointError("no output folder; add out=DIR (a new or empty folder for the checkpoint)")
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"out={str(out)!r} is a file; give a new or empty folder for the checkpoint")
    if path.is_dir() and any(path.iterdir()):
        raise CheckpointError(
            f"out={str(out)!r} exists and is not empty; give a new or empty folder (or delete this one first): "
            "an export never overwrites files"
        )
    return path


def _text_config(config: Any) -> Any:
    """The decoder's config (itself for plain LMs; ``text_config`` for multimodal wrappers)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def kept_layers(
    skip: Iterable[int], num_layers: int, error: type[CheckpointError] = CheckpointError
) -> list[int]:
    """The layers an export keeps (ascending), once ``skip`` is checked against the model.

    Raises:
        error: a layer out of range, or a skip set that deletes every layer.
    """
    drop = frozenset(int(i) for i in skip)
    bad = sorted(i for i in drop if not 0 <= i < num_layers)
    if bad:
        raise error(f"layer(s) {bad} out of range: the model has {num_layers} layers (0..{num_layers - 1})")
    kept = [i for i in range(num_layers) if i not in drop]
    if not kept:
        raise error(f"the skip set deletes all {num_layers} layers; nothing would be left to export")
    return kept


def delete_layers(model: torch.nn.Module, skip: Iterable[int], layers_path: str = "model.layers") -> list[int]:
    """Delete the decoder layers in ``skip`` from ``model``, in place, and renumber the rest.

    Every kept layer's submodules with an integer ``layer_idx`` (attention's, which picks the
    layer's KV-cache slot and per-layer settings) get the layer's new position; the config's
    ``num_hidden_layers`` and each per-layer list (a list as long as the layer count, such as
    ``layer_types``) keep the kept layers' entries, in order.

    Args:
        model: A transformers causal LM, freshly loaded (it is changed).
        skip: Layer indices of ``model`` to delete.
        layers_path: Attribute path of the decoder-layer list (``ModelConfig.layers_path``).

    Returns:
        The kept layers' old indices, in order (new layer ``j`` was layer ``kept[j]``).

    Raises:
        CheckpointError: A layer outside the model, every layer deleted, or no layer list at
            ``layers_path``.
    """
    parent_path, _, attr = layers_path.rpartition(".")
    try:
        parent = operator.attrgetter(parent_path)(model) if parent_path else model
        layers = getattr(parent, attr)
    except AttributeError as e:
        raise CheckpointError(
            f"no decoder layers at {layers_path!r} in {type(model).__name__}; set model.layers_path in the model's config"
        ) from e
    n = len(layers)
    kept = kept_layers(skip, n)
    setattr(parent, attr, torch.nn.ModuleList([layers[i] for i in kept]))
    for new, layer in enumerate(getattr(parent, attr)):
        for module in layer.modules():
            idx = getattr(module, "layer_idx", None)
            if isinstance(idx, int) and not isinstance(idx, bool):
                module.layer_idx = new
    for config in {id(c): c for c in (model.config, _text_config(model.config))}.values():
        old = getattr(config, "num_hidden_layers", None)
        if old != n:
            continue  # a wrapper config that does not describe this decoder
        for key, value in list(vars(config).items()):
            if key not in NOT_PER_LAYER and isinstance(value, (list, tuple)) and len(value) == n:
                setattr(config, key, type(value)(value[i] for i in kept))
        config.num_hidden_layers = len(kept)
    # The skip controller holds the old layer list and count: drop it with them.
    model.__dict__.pop(_SKIP_CONTROLLER_ATTR, None)
    return kept


def save_checkpoint(model: Any, tokenizer: Any, out: str | os.PathLike[str], info: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (safetensors, config, generation config) and ``tokenizer`` to ``out``.

    The files go to a temporary folder beside ``out`` that is renamed into place at the end:
    an interrupted export leaves no half-written checkpoint. A model loaded from GGUF is
    saveable once its quantizer is cleared (its weights are already dequantized, FACTS.md).

    Args:
        out: A new or empty folder (:func:`check_out_dir`).
        info: Written as ``tss_export.json`` (provenance) when given.
    """
    path = check_out_dir(out)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        gen = getattr(model, "generation_config", None)
        if gen is not None and not (tmp / "generation_config.json").is_file():
            gen.save_pretrained(tmp)
        if info is not None:
            (tmp / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
        if path.is_dir():
            path.rmdir()  # empty (checked): replaced by the finished folder
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
    return path


def export_domain_checkpoint(
    model: Any,
    tokenizer: Any,
    mapping: DomainMapping,
    domain: str,
    out: str | os.PathLike[str],
    *,
    model_id: str,
    layers_path: str = "model.layers",
    force: bool = False,
) -> ExportSummary:
    """Write ``domain``'s sparse target as a Hugging Face checkpoint in ``out``.

    Args:
        model: The mapping's target model, freshly loaded (its layers are deleted in place).
        tokenizer: Saved with it.
        mapping: The mapping file's content.
        domain: The domain whose skip set is deleted.
        out: A new or empty folder.
        model_id: The loaded model's id, checked against the mapping's.
        layers_path: Attribute path of the decoder layers.
        force: Export an entry of scope ``verify`` although the checkpoint then differs from
            the served target (its prefill is sparse too).

    Raises:
        CheckpointError: No entry for ``domain``, scope ``verify`` without ``force``, a
            non-empty ``out``.
        MappingError: The mapping was searched on another model.
    """
    num_layers = int(_text_config(model.config).num_hidden_layers)
    mapping.check_model(model_id, num_layers)
    entry = entry_to_export(mapping, domain)
    check_exportable(entry, force=force)
    check_out_dir(out)
    kept = delete_layers(model, entry.skip_set, layers_path)
    summary = ExportSummary(**summary_fields(out, domain, entry, model_id, num_layers, len(kept), force))
    save_checkpoint(model, tokenizer, out, export_info(summary, entry, kept, mapping))
    return summary


def export_info(summary: ExportSummary, entry: MappingEntry, kept: list[int], mapping: DomainMapping) -> dict[str, Any]:
    """The provenance record of an export (``tss_export.json``; a GGUF's ``tss.export``).

    Args:
        summary: What was exported (its ``out`` is left out: the record travels with the files).
        entry: The mapping entry exported.
        kept: The kept layers' source indices (new layer ``j`` was source layer ``kept[j]``).
        mapping: The mapping file it came from.
    """
    info = {
        **summary.to_dict(),
        "kept_layers": list(kept),  # new layer j was source layer kept[j]
        "verification": entry.verification,
        ACCEPT_LENGTH: entry.accept_length,
        METRIC: entry.metric,
        "metric_name": entry.metric_name,
        COST: entry.cost,
        "sparsity": entry.sparsity,
        "baseline": dict(entry.baseline),  # the dense run's figures, side by side
        "drafter": entry.drafter,
        "selection": entry.selection,
        "split": entry.split,
        "mapping": str(mapping.path) if mapping.path else None,
        "study": dict(entry.study),
    }
    info.pop("out")
    return info
