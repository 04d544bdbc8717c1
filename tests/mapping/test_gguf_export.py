"""A domain's sparse target as a GGUF file: the block surgery on a GGUF written with
the ``gguf`` package, read back with its reader. llama.cpp itself runs the export of the
embedded model in test_gguf_llama.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from test_mapping_file import entry

from tss_opt.config.enums import GGUFOutType
from tss_opt.mapping import MappingError, load_mapping, write_entry
from tss_opt.mapping.checkpoint import CheckpointError
from tss_opt.mapping.gguf_export import (
    PROVENANCE_KEY,
    GGUFExportError,
    export_domain_gguf,
    source_gguf_path,
)
from tss_opt.models import ModelConfig

MODEL_ID = "tiny-llama-4l-seed0"


def mapping(tmp_path, skip=(1,), scope="all", domain="qa"):
    path = tmp_path / "mapping.yaml"
    write_entry(path, replace(entry(domain, skip, model=MODEL_ID, layers=4), scope=scope))
    return load_mapping(path)


def export(tmp_path, source, skip=(1,), outtype="f32", scope="all", force=False, out="out"):
    return export_domain_gguf(
        source, mapping(tmp_path, skip, scope), "qa", tmp_path / out, model_name="tiny", model_id=MODEL_ID,
        num_layers=4, outtype=outtype, force=force,
    )


def field(reader, key):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def values(reader, name):
    (t,) = [t for t in reader.tensors if t.name == name]
    return dequantize(t.data, t.tensor_type), t.tensor_type


@pytest.mark.parametrize("skip", [(1,), (0, 3), (1, 2)])
def test_f32_export_drops_the_blocks_renumbers_the_rest_and_carries_everything_else(tmp_path, tiny_gguf, skip):
    summary = export(tmp_path, tiny_gguf, skip)
    kept = [i for i in range(4) if i not in skip]
    assert summary.out == str(tmp_path / "out" / "tiny-qa.gguf") and summary.layers == len(kept)
    src, out = GGUFReader(tiny_gguf), GGUFReader(summary.out)
    assert field(out, "llama.block_count") == len(kept)
    assert sorted(t.name for t in out.tensors) == sorted(
        ["token_embd.weight", "output.weight"]
        + [f"blk.{j}.{n}" for j in range(len(kept)) for n in ("attn_norm.weight", "attn_q.weight")]
    )
    for j, i in enumerate(kept):
        # Block j is source block i, its values exactly (Q4_1 dequantized by gguf's own code).
        for name in ("attn_norm.weight", "attn_q.weight"):
            got, qtype = values(out, f"blk.{j}.{name}")
            want, _ = values(src, f"blk.{i}.{name}")
            assert qtype == GGMLQuantizationType.F32
            np.testing.assert_array_equal(got, want)
    # Per-layer arrays are cut; an array that merely has the block count's length is not.
    assert field(out, "llama.attention.sliding_window_pattern") == [i % 2 == 0 for i in kept]
    assert field(out, "llama.rope.dimension_sections") == [1, 2, 3, 4]
    # Everything else is carried; the file type says what the tensors now are (ALL_F32).
    assert field(out, "tokenizer.chat_template") == field(src, "tokenizer.chat_template")
    assert field(out, "llama.embedding_length") == 64 and field(out, "general.file_type") == 0
    # Provenance: typed keys and the whole record.
    assert field(out, "tss.domain") == "qa" and field(out, "tss.scope") == "all"
    assert field(out, "tss.skip_set") == list(skip) and field(out, "tss.kept_layers") == kept
    assert field(out, "tss.source_model") == MODEL_ID and field(out, "tss.source_layers") == 4
    assert field(out, "tss.accept_length") == pytest.approx(2.74) and field(out, "tss.metric_name") == "f1"
    assert field(out, "tss.baseline.cost") == 1.0 and field(out, "tss.outtype") == "f32"
    record = json.loads(field(out, PROVENANCE_KEY))
    assert record["skip_set"] == list(skip) and record["kept_layers"] == kept
    assert record["source_gguf"] == "dense.gguf" and record["selection"] == "min_cost"
    assert field(out, "general.name") == f"tiny test model (qa sparse target, {len(kept)} of 4 layers)"
    card = (tmp_path / "out" / "tiny-qa.md").read_text()
    assert f"Decoder layers {list(skip)} of 4 are deleted" in card and "llama-server -m tiny-qa.gguf" in card
    assert "FROM ./tiny-qa.gguf" in card and "scope=all" in card


def test_f16_and_q8_0_round_the_matrices_and_keep_1d_tensors_f32(tmp_path, tiny_gguf):
    ref = GGUFReader(export(tmp_path, tiny_gguf, outtype="f32", out="f32").out)
    f16 = GGUFReader(export(tmp_path, tiny_gguf, outtype=GGUFOutType.f16, out="f16").out)
    q8 = GGUFReader(export(tmp_path, tiny_gguf, outtype="q8_0", out="q8").out)
    assert (field(f16, "general.file_type"), field(q8, "general.file_type")) == (1, 7)
    for reader, matrix, tol in ((f16, GGMLQuantizationType.F16, 2e-3), (q8, GGMLQuantizationType.Q8_0, 3e-2)):
        got, qtype = values(reader, "blk.1.attn_q.weight")
        assert qtype == matrix
        want, _ = values(ref, "blk.1.attn_q.weight")
        np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max())
        assert not np.array_equal(got, want)  # rounded: the comparison above could fail
        got, qtype = values(reader, "blk.1.attn_norm.weight")
        assert qtype == GGMLQuantizationType.F32 and np.array_equal(got, values(ref, "blk.1.attn_norm.weight")[0])
    # Rows of 48 are not whole Q8_0 blocks (32): F16, as llama.cpp's converter falls back.
    assert values(q8, "output.weight")[1] == GGMLQuantizationType.F16


def test_bf16_rounds_the_matrices_as_torch_bfloat16_does(tmp_path, tiny_gguf):
    """A bf16 GGUF holds what ``dtype=bfloat16`` runs: each float32 weight rounded to
    bfloat16 (nearest, ties to even) exactly as torch rounds it; norms stay F32."""
    import torch

    ref = GGUFReader(export(tmp_path, tiny_gguf, outtype="f32", out="f32").out)
    bf16 = GGUFReader(export(tmp_path, tiny_gguf, outtype=GGUFOutType.bf16, out="bf16").out)
    assert field(bf16, "general.file_type") == 32  # LlamaFileType.MOSTLY_BF16
    got, qtype = values(bf16, "blk.1.attn_q.weight")
    want, _ = values(ref, "blk.1.attn_q.weight")
    assert qtype == GGMLQuantizationType.BF16 and not np.array_equal(got, want)
    np.testing.assert_array_equal(got, torch.from_numpy(want).to(torch.bfloat16).float().numpy())
    got, qtype = values(bf16, "blk.1.attn_norm.weight")
    assert qtype == GGMLQuantizationType.F32 and np.array_equal(got, values(ref, "blk.1.attn_norm.weight")[0])


def test_dense_entry_exports_every_block(tmp_path, tiny_gguf):
    summary = export(tmp_path, tiny_gguf, skip=())
    out = GGUFReader(summary.out)
    assert summary.dense and field(out, "llama.block_count") == 4 and field(out, "tss.dense") is True
    assert field(out, "tss.skip_set") is None  # the gguf writer refuses an empty array
    assert json.loads(field(out, PROVENANCE_KEY))["skip_set"] == []


def test_verify_scope_is_refused_unless_forced(tmp_path, tiny_gguf):
    with pytest.raises(CheckpointError, match="scope=verify.*force=true"):
        export(tmp_path, tiny_gguf, scope="verify")
    assert not (tmp_path / "out").exists()
    summary = export(tmp_path, tiny_gguf, scope="verify", force=True)
    assert summary.forced and "**Warning:**" in (tmp_path / "out" / "tiny-qa.md").read_text()


def test_never_overwrites_and_leaves_no_partial_file(tmp_path, tiny_gguf):
    export(tmp_path, tiny_gguf)
    before = (tmp_path / "out" / "tiny-qa.gguf").read_bytes()
    with pytest.raises(GGUFExportError, match="tiny-qa.gguf exists; an export never overwrites"):
        export(tmp_path, tiny_gguf, skip=(2,))
    assert (tmp_path / "out" / "tiny-qa.gguf").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tiny-qa.gguf", "tiny-qa.md"]


def test_bad_sources_are_named(tmp_path, tiny_gguf, make_tiny_gguf):
    other = make_tiny_gguf("six.gguf", blocks=6)
    with pytest.raises(GGUFExportError, match="has 6 blocks but the mapping's model has 4 layers"):
        export(tmp_path, other)
    extra = make_tiny_gguf("extra.gguf", extra_block=True)
    with pytest.raises(GGUFExportError, match="tensor blk.4.attn_norm.weight of block 4 beyond its 4 blocks"):
        export(tmp_path, extra)
    assert not list(tmp_path.glob("out/*"))  # refused before anything is written
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(GGUFExportError, match="could not be read as a GGUF file"):
        export(tmp_path, tmp_path / "junk.gguf")
    with pytest.raises(MappingError):
        export_domain_gguf(
            tiny_gguf, mapping(tmp_path), "qa", tmp_path / "o", model_name="tiny", model_id="other", num_layers=4
        )


def test_source_gguf_of_each_model_source(tmp_path, tiny_gguf):
    tiny = ModelConfig(name="tiny", source="tiny", num_layers=4)
    assert source_gguf_path(tiny, str(tiny_gguf)) == tiny_gguf
    with pytest.raises(GGUFExportError, match="ships no GGUF file; .*convert_hf_to_gguf.py .*gguf_source="):
        source_gguf_path(tiny)
    with pytest.raises(GGUFExportError, match="gguf_source='missing.gguf' is not a file"):
        source_gguf_path(tiny, "missing.gguf")
    hf = ModelConfig(name="m", source="hf", path="org/model")
    with pytest.raises(GGUFExportError, match="convert_hf_to_gguf.py org/model --outtype f32"):
        source_gguf_path(hf)
