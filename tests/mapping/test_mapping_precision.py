"""The mapping records the precision its study searched in; serving in another is flagged
(tss_opt/mapping/format.py: ``MappingEntry.dtype``, ``DomainMapping.precision_note``)."""

from __future__ import annotations

from dataclasses import replace

import yaml
from test_mapping_file import Toy, entry

from tss_opt.mapping import export_mapping, load_mapping, write_entry


def test_dtype_round_trips_and_older_entries_read_as_unknown(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, replace(entry("qa"), dtype="float32"))
    write_entry(path, entry("rag"))  # an entry of an older file: no dtype recorded
    data = yaml.safe_load(path.read_text())
    assert data["domains"]["qa"]["dtype"] == "float32"
    assert "dtype" not in data["domains"]["rag"]  # older entries round-trip unchanged
    m = load_mapping(path)
    assert m.entry_for("qa").dtype == "float32" and m.entry_for("rag").dtype is None


def test_serving_in_another_precision_is_noted(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, replace(entry("qa"), dtype="float32"))
    write_entry(path, entry("rag"))
    m = load_mapping(path)
    assert m.precision_note("float32") is None  # the searched precision; rag recorded none
    note = m.precision_note("bfloat16")
    assert note is not None
    assert "bfloat16" in note and "qa in float32" in note and "rag" not in note
    assert "dtype=float32" in note  # the fix


def test_export_records_the_study_protocols_dtype(tmp_path) -> None:
    from tss_opt.search import run_search

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    meta = {"model": "synthetic/model-8", "domain": "qa", "drafter": "pld", "split": "calibration",
            "protocol": {"dtype": "float32", "prompts": 2}}
    run_search(Toy(), storage=url, study_name="qa-study", max_depth=1, metadata=meta, show_progress=False)
    written = export_mapping(url, "qa-study", tmp_path / "mapping.yaml")
    assert written.dtype == "float32"
    assert load_mapping(tmp_path / "mapping.yaml").entry_for("qa").dtype == "float32"
