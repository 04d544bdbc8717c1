"""When llama.cpp's weight repacking is turned off (tss_opt/mapping/llama_runner.py): a quantized
file on a CPU with AMX, where it crashes; never otherwise (the fast path stays on)."""

from __future__ import annotations

import pytest

from tss_opt.config.enums import GGUFOutType
from tss_opt.mapping.llama_runner import AMX_FLAG, repacking_crashes

AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", AMX_FLAG, "amx_tile"})
NO_AMX = frozenset({"avx512f", "avx512_bf16", "avx512_vnni"})


@pytest.mark.parametrize(
    ("quantized", "flags", "off"),
    [(True, AMX, True), (False, AMX, False), (True, NO_AMX, False), (False, NO_AMX, False), (True, frozenset(), False)],
)
def test_repacking_is_off_only_for_quantized_files_on_amx(quantized, flags, off):
    assert repacking_crashes(quantized, flags) is off


def test_only_q8_0_among_the_export_types_is_quantized():
    assert [t.value for t in GGUFOutType if t.quantized] == ["q8_0"]
