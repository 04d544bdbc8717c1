"""Mapping entries record the skip scope their search measured."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from test_mapping_file import Toy, entry

from tss_opt.mapping import MappingError, export_mapping, load_mapping, write_entry


def test_scope_round_trips_and_old_entries_read_as_verify(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, replace(entry("qa", (3, 7)), scope="all"))
    write_entry(path, entry("rag", (4,)))
    data = yaml.safe_load(path.read_text())
    assert data["domains"]["qa"]["scope"] == "all" and data["domains"]["rag"]["scope"] == "verify"
    m = load_mapping(path)
    assert m.entry_for("qa").scope == "all" and m.entry_for("rag").scope == "verify"
    # A file written before the scope was recorded: the entry has no key and reads as verify.
    del data["domains"]["qa"]["scope"]
    path.write_text(yaml.safe_dump(data))
    assert load_mapping(path).entry_for("qa").scope == "verify"


def test_an_unknown_scope_is_refused_naming_the_field(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, entry("qa", (3,)))
    data = yaml.safe_load(path.read_text())
    data["domains"]["qa"]["scope"] = "prefill"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(MappingError, match=r"domains\.qa\.scope: expected one of verify, all.*'prefill'"):
        load_mapping(path)


@pytest.mark.parametrize("protocol", [{"scope": "all"}, {"scope": "verify"}, None])
def test_export_writes_the_scope_the_study_searched_with(tmp_path, protocol) -> None:
    from tss_opt.search import run_search

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    meta = {"model": "synthetic/model-8", "domain": "qa", "drafter": "pld", "split": "calibration"}
    if protocol is not None:
        meta["protocol"] = protocol
    run_search(Toy(), storage=url, study_name="s", max_depth=1, metadata=meta, show_progress=False)
    path = tmp_path / "mapping.yaml"
    written = export_mapping(url, "s", path)
    expected = protocol["scope"] if protocol else "verify"  # studies from before: verify
    assert written.scope == expected
    assert load_mapping(path).entry_for("qa").scope == expected
