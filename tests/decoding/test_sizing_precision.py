"""Latency tables are keyed by precision: a table measured in float32 never sizes a bfloat16
run (tss_opt/decoding/sizing/: ``hardware_key``, ``table_path``, ``load_or_measure``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tss_opt.decoding import linear
from tss_opt.decoding.batch_budget import batch_latency_path
from tss_opt.decoding.kernels import rows
from tss_opt.decoding.sizing import LatencyTable, hardware_key, load_or_measure_latency
from tss_opt.decoding.sizing.latency import SCHEDULE_KEYS
from tss_opt.decoding.sizing.measured import table_path
from tss_opt.decoding.target import TargetModel
from tss_opt.models import ModelConfig, load_model


@pytest.fixture(scope="module")
def targets() -> dict[str, TargetModel]:
    """The same tiny model (same seed) in float32 and in bfloat16."""
    return {
        dt: TargetModel(load_model(ModelConfig(name="tiny", source="tiny", num_layers=2, dtype=dt)).model)
        for dt in ("float32", "bfloat16")
    }


def test_the_key_and_the_file_name_carry_the_dtype(targets, tmp_path: Path) -> None:
    k32, k16 = hardware_key(targets["float32"]), hardware_key(targets["bfloat16"])
    assert (k32["dtype"], k16["dtype"]) == ("float32", "bfloat16")
    # Besides the dtype only the prepacked products (bfloat16 on a CPU whose oneDNN has them,
    # decoding/linear.py: " packed", or " rows+stream" / " rows+prefetch" for our rows kernels,
    # float32's included) mark the model: the same machine, model and device.
    schedule = SCHEDULE_KEYS[rows.SCHEDULE]

    def rest(key: dict[str, str]) -> dict[str, str]:
        model = key["model"].removesuffix(" packed").removesuffix(f" rows+amx{schedule}").removesuffix(f" rows{schedule}")
        return {**{k: v for k, v in key.items() if k != "dtype"}, "model": model}

    assert rest(k32) == rest(k16)
    f32_kernel = f" rows{schedule}" if linear.packed_kernel(targets["float32"].model) == "rows" else ""
    assert k32["model"] == rest(k32)["model"] + f32_kernel
    assert table_path("latency", k32, tmp_path) != table_path("latency", k16, tmp_path)
    assert batch_latency_path(targets["float32"], tmp_path) != batch_latency_path(targets["bfloat16"], tmp_path)


def test_a_float32_table_does_not_size_a_bfloat16_target(targets, tmp_path: Path) -> None:
    t32 = load_or_measure_latency(targets["float32"], tmp_path, sizes=(0, 1))
    # Make the float32 table recognisable: seconds no measurement gives.
    fake = LatencyTable(seconds={0: 123.0, 1: 456.0}, key=t32.key, measured_at=t32.measured_at)
    (f32,) = tmp_path.glob("latency-*.json")
    f32.write_text(json.dumps(fake.to_dict()))
    assert load_or_measure_latency(targets["float32"], tmp_path, sizes=(0, 1)).seconds == {0: 123.0, 1: 456.0}
    t16 = load_or_measure_latency(targets["bfloat16"], tmp_path, sizes=(0, 1))
    assert t16.key["dtype"] == "bfloat16" and t16.seconds != fake.seconds
    assert len(list(tmp_path.glob("latency-*.json"))) == 2  # one file per precision


def test_a_float32_table_under_the_bfloat16_name_is_measured_again(targets, tmp_path: Path, caplog) -> None:
    t32 = load_or_measure_latency(targets["float32"], tmp_path / "f32", sizes=(0, 1))
    bf16_path = table_path("latency", hardware_key(targets["bfloat16"]), tmp_path / "bf16")
    bf16_path.parent.mkdir()
    fake = LatencyTable(seconds={0: 123.0, 1: 456.0}, key=t32.key, measured_at=t32.measured_at)
    bf16_path.write_text(json.dumps(fake.to_dict()))  # a float32 table copied under the bf16 name
    with caplog.at_level(logging.WARNING, logger="tss_opt.decoding.sizing.measured"):
        got = load_or_measure_latency(targets["bfloat16"], tmp_path / "bf16", sizes=(0, 1))
    assert got.key["dtype"] == "bfloat16" and got.seconds != fake.seconds
    assert json.loads(bf16_path.read_text())["key"]["dtype"] == "bfloat16"  # overwritten with its own
    assert any("measuring it again" in r.getMessage() and "float32" in r.getMessage() for r in caplog.records)
