"""``dtype: auto`` (tss_opt/models/precision.py): chosen from the CPU's flags (injected here),
explicit dtypes win, a search on CPU keeps float32, a bad value is a clear error."""

from __future__ import annotations

import logging

import pytest
import torch

from tss_opt.models import (
    AUTO,
    ModelConfig,
    ModelLoadError,
    as_model_config,
    choose_dtype,
    cpu_flags,
    load_model,
    precision,
)
from tss_opt.models.precision import resolve_model_dtype

BF16_FLAGS = {"fpu", "avx512f", "avx512_vnni", "avx512_bf16"}
NO_BF16_FLAGS = {"fpu", "avx2", "avx512f"}


@pytest.fixture(autouse=True)
def _fresh_announcements():
    """Each test sees its own first INFO line (the module logs each distinct choice once)."""
    precision._announced.clear()
    yield
    precision._announced.clear()


def test_auto_on_a_cpu_with_native_bf16_decodes_in_bfloat16():
    choice = choose_dtype(AUTO, "cpu", "decode", flags=BF16_FLAGS)
    assert choice.dtype == "bfloat16" and choice.auto
    assert "avx512_bf16" in choice.reason
    # AMX alone counts too.
    assert choose_dtype(AUTO, "cpu", flags={"amx_bf16", "amx_tile"}).dtype == "bfloat16"


def test_auto_on_a_cpu_without_native_bf16_decodes_in_float32():
    choice = choose_dtype(AUTO, "cpu", "decode", flags=NO_BF16_FLAGS)
    assert choice.dtype == "float32"
    assert "avx512_bf16" in choice.reason and "amx_bf16" in choice.reason  # says which flags it looked for


def test_flags_are_read_only_when_they_matter():
    def boom() -> set[str]:
        raise AssertionError("flags read")

    assert choose_dtype("float32", "cpu", flags=boom).dtype == "float32"
    assert choose_dtype(AUTO, "cpu", "search", flags=boom).dtype == "float32"
    assert choose_dtype(AUTO, "cuda", flags=boom, cuda_bf16=True).dtype == "bfloat16"


@pytest.mark.parametrize("setting", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("purpose", ["decode", "search"])
def test_explicit_dtype_wins(setting, purpose):
    for flags in (BF16_FLAGS, NO_BF16_FLAGS):
        choice = choose_dtype(setting, "cpu", purpose, flags=flags)
        assert choice.dtype == setting and not choice.auto
    mc = ModelConfig(name="tiny", source="tiny", num_layers=2, dtype=setting)
    assert resolve_model_dtype(mc, purpose, flags=BF16_FLAGS) is mc


def test_a_search_on_cpu_resolves_auto_to_float32(caplog):
    mc = ModelConfig(name="tiny", source="tiny", num_layers=2, dtype=AUTO)
    with caplog.at_level(logging.INFO, logger="tss_opt.models.precision"):
        out = resolve_model_dtype(mc, "search", flags=BF16_FLAGS)
    assert out.dtype == "float32" and out.name == mc.name
    assert any("dtype=auto: float32" in r.getMessage() and "search" in r.getMessage() for r in caplog.records)
    # The same machine decodes in bfloat16.
    assert resolve_model_dtype(mc, "decode", flags=BF16_FLAGS).dtype == "bfloat16"


def test_cuda_picks_the_half_type_the_gpu_has():
    assert choose_dtype(AUTO, "cuda:0", cuda_bf16=True).dtype == "bfloat16"
    assert choose_dtype(AUTO, "cuda", cuda_bf16=False).dtype == "float16"
    assert choose_dtype(AUTO, "cuda", "search", cuda_bf16=lambda: False).dtype == "float16"


def test_decode_logs_one_info_line_naming_the_flag(caplog):
    mc = ModelConfig(name="tiny", source="tiny", num_layers=2, dtype=AUTO, device="cpu")
    flags = {"avx512_bf16"}
    with caplog.at_level(logging.INFO, logger="tss_opt.models.precision"):
        resolve_model_dtype(mc, flags=flags)
        resolve_model_dtype(mc, flags=flags)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype=auto")]
    assert len(lines) == 1, lines  # once per distinct choice (identity and load both resolve)
    assert "bfloat16" in lines[0] and "avx512_bf16" in lines[0]


def test_cpu_flags_reads_the_flags_line(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 avx512_vnni\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(f) == frozenset({"fpu", "avx512_bf16", "avx512_vnni"})
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_bad_dtype_names_the_value_what_is_expected_and_the_fix():
    with pytest.raises(ModelLoadError) as e:
        as_model_config(ModelConfig(name="tiny", source="tiny", num_layers=2, dtype="bf16"))
    msg = str(e.value)
    assert "'bf16'" in msg and "auto" in msg and "bfloat16" in msg and "Set dtype=" in msg


def test_load_model_resolves_auto_and_records_the_concrete_dtype():
    loaded = load_model(ModelConfig(name="tiny", source="tiny", num_layers=2, dtype=AUTO))
    assert loaded.config.dtype in ("float32", "bfloat16")
    assert next(loaded.model.parameters()).dtype == getattr(torch, loaded.config.dtype)
