"""Mapping files: several domains, validation, corrupt files, concurrent writers, export."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tss_opt.mapping import (
    MappingEntry,
    MappingError,
    OperatingPoint,
    export_mapping,
    load_mapping,
    write_entry,
)

REPO = Path(__file__).resolve().parents[2]


def entry(
    domain: str = "qa", skip=(3, 7), model: str = "org/model", layers: int = 30
) -> MappingEntry:
    return MappingEntry(
        domain=domain,
        skip_set=tuple(skip),
        accept_length=2.74,
        metric=0.129,
        metric_name="f1",
        cost=0.91,
        sparsity=len(skip) / layers,
        baseline={"accept_length": 2.53, "metric": 0.12, "cost": 1.0},
        model=model,
        num_layers=layers,
        drafter="pld",
        study={
            "name": f"{domain}.model.pld.calibration.s0000000",
            "storage": "sqlite:///storage/tss.db",
        },
        selection="min_cost",
        alternatives=(OperatingPoint((3,), 2.6, 0.125, 0.95, 1 / layers),),
        split="calibration",
    )


def test_two_domains_are_both_kept(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, entry("qa", (3, 7)))
    write_entry(path, entry("translation", (3, 25, 29)))
    write_entry(path, entry("qa", (4,)))  # replacing one domain keeps the other
    m = load_mapping(path)
    assert m.domains == ["qa", "translation"]
    assert m.entry_for("qa") == entry("qa", (4,))
    assert m.entry_for("translation").skip == frozenset({3, 25, 29})
    assert m.entry_for("rag") is None and m.skip_set_for("rag") == frozenset()
    assert (m.model, m.num_layers) == ("org/model", 30)
    m.check_model("org/model", 30)
    with pytest.raises(
        MappingError,
        match="for model 'org/model' \\(30 layers\\), but the loaded model is 'other' \\(32 layers\\)",
    ):
        m.check_model("other", 32)
    data = yaml.safe_load(path.read_text())
    assert data["domains"]["translation"]["alternatives"][0]["skip_set"] == [3]


def test_missing_and_corrupt_files(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    with pytest.raises(MappingError, match=f"{path} does not exist"):
        load_mapping(path)
    path.write_text("domains: {qa: [unclosed\n")
    before = path.read_bytes()
    with pytest.raises(MappingError, match=f"{path} is not valid YAML"):
        load_mapping(path)
    with pytest.raises(MappingError, match="not valid YAML"):
        write_entry(path, entry())
    assert path.read_bytes() == before  # a corrupt file is never overwritten
    path.write_text("just a string\n")
    with pytest.raises(MappingError, match="top level: expected a mapping"):
        write_entry(path, entry())
    assert path.read_text() == "just a string\n"


def test_layers_out_of_range_are_refused(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, entry())
    data = yaml.safe_load(path.read_text())
    data["domains"]["qa"]["skip_set"] = [3, 30]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        MappingError, match=r"domains.qa.skip_set: layer\(s\) \[30\] outside \[0, 30\)"
    ):
        load_mapping(path)
    fresh = tmp_path / "fresh.yaml"
    with pytest.raises(MappingError, match=r"layer\(s\) \[31\] outside"):
        write_entry(fresh, entry(skip=(1, 31)))
    assert not fresh.exists()


def test_another_model_is_refused_in_the_same_file(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    write_entry(path, entry())
    with pytest.raises(MappingError, match="write it to another mapping file"):
        write_entry(path, entry("mmlu", model="other/model", layers=32))
    assert load_mapping(path).domains == ["qa"]


_WRITER = textwrap.dedent(
    """
    import sys
    from tss_opt.mapping import MappingEntry, write_entry
    path, worker = sys.argv[1], int(sys.argv[2])
    for i in range(5):
        write_entry(path, MappingEntry(
            domain=f"d{worker}_{i}", skip_set=(worker, i + 10), accept_length=2.0, metric=0.5,
            metric_name="f1", cost=0.9, sparsity=2 / 30,
            baseline={"accept_length": 1.9, "metric": 0.5, "cost": 1.0}, model="org/model",
            num_layers=30, drafter=None, study={}, selection="min_cost"))
    """
)


@pytest.mark.slow
def test_concurrent_writers_keep_every_entry(tmp_path) -> None:
    path = tmp_path / "mapping.yaml"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w)], env=env, cwd=REPO)
        for w in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    m = load_mapping(path)
    assert m.domains == sorted(f"d{w}_{i}" for w in range(4) for i in range(5))
    assert m.entry_for("d3_4").skip_set == (3, 14)
    assert not list(tmp_path.glob(".mapping.yaml.*.tmp"))  # no temp file left behind


class Toy:
    """8 layers; skipping layer 1 or 2 helps, the others hurt; pairs interact."""

    num_layers = 8
    metric_name = "f1"

    def __init__(self, interrupt_after: int | None = None) -> None:
        self.calls, self.interrupt_after = 0, interrupt_after

    def __call__(self, skip: frozenset[int]) -> dict:
        self.calls += 1
        if self.calls == self.interrupt_after:
            raise KeyboardInterrupt
        a = 3.0 + sum(0.1 if i in (1, 2) else -0.2 * (i % 3) for i in skip)
        m = 0.5 - 0.01 * len(skip) + (0.03 if {1, 2} <= skip else 0.0)
        return {"accept_length": a, "metric": m, "cost": 1.0 - 0.05 * len(skip) + 0.001 * sum(skip)}


def test_export_from_a_finished_study(tmp_path) -> None:
    from tss_opt.search import run_search

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    meta = {"model": "synthetic/model-8", "domain": "qa", "drafter": "pld", "split": "calibration"}
    with pytest.raises(KeyboardInterrupt):
        run_search(Toy(interrupt_after=5), storage=url, study_name="qa-study",
                   max_depth=2, metadata=meta, show_progress=False)  # fmt: skip
    path = tmp_path / "mapping.yaml"
    with pytest.raises(MappingError, match="is not finished"):
        export_mapping(url, "qa-study", path)
    assert not path.exists()

    result = run_search(Toy(), storage=url, study_name="qa-study", max_depth=2,
                        metadata=meta, show_progress=False)  # fmt: skip
    written = export_mapping(url, "qa-study", path)
    loaded = load_mapping(path).entry_for("qa")
    assert loaded == replace(written)  # what was written loads back equal
    best = result.best_record
    assert loaded.skip == result.best
    assert (loaded.accept_length, loaded.metric, loaded.cost) == (
        best.accept_length,
        best.metric,
        best.cost,
    )
    assert loaded.sparsity == len(result.best) / 8
    assert loaded.baseline == {k: result.baseline[k] for k in ("accept_length", "metric", "cost")}
    assert (loaded.model, loaded.num_layers, loaded.drafter, loaded.split) == (
        "synthetic/model-8",
        8,
        "pld",
        "calibration",
    )
    assert loaded.study == {"name": "qa-study", "storage": url}
    assert {frozenset(a.skip_set) for a in loaded.alternatives} == set(result.pareto) - {
        result.best
    }
    # Exporting under another domain name adds a second entry.
    export_mapping(url, "qa-study", path, domain="rag")
    assert load_mapping(path).domains == ["qa", "rag"]


def test_a_yaml_that_is_not_a_mapping_file_is_refused(tmp_path):
    from tss_opt.mapping import MappingError, load_mapping

    p = tmp_path / "tiny.yaml"
    p.write_text("name: tiny\nsource: tiny\nnum_layers: 4\n")
    with pytest.raises(MappingError, match="format, model, num_layers, domains"):
        load_mapping(p)
