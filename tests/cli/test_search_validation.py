"""The search command checks its candidates on the validation split before writing the mapping:
tiny model, shipped domain, a small budget, a real SQLite study."""

from __future__ import annotations

import optuna
import pytest
import yaml

from tss_opt.assembly import compose_config
from tss_opt.cli.search import search

BASE = [
    "+domain=translation", "+model=tiny", "search=algorithm1", "search.prompts=4", "max_new_tokens=6",
    "search.max_depth=1", "search.early_barrier=1", "search.latter_barrier=1", "search.validation_prompts=4",
    "search.eps_accept=0.5", "search.eps_metric=0.5", "search.tau_accept=0.5", "search.tau_metric=0.5",
]


@pytest.mark.timeout(600)
def test_search_validates_before_the_mapping(tmp_path, capsys) -> None:
    db, mapping = tmp_path / "s.db", tmp_path / "map.yaml"
    cfg = compose_config([*BASE, f"storage=sqlite:///{db}", f"mapping_path={mapping}"])
    result = search(cfg)
    out = capsys.readouterr().out
    assert "validation" in out
    stored = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{db}").user_attrs["validation"]
    entry = yaml.safe_load(mapping.read_text())["domains"]["translation"]
    # The mapping carries the validated choice (or dense with the reason), with the figures.
    assert entry["skip_set"] == sorted(stored["chosen"])
    assert entry["validation"]["reason"] == stored["reason"]
    checked = [c["skip_set"] for c in stored["candidates"]]
    assert 1 <= len(checked) <= 3 and all(c for c in checked)
    if stored["chosen"]:
        assert sorted(stored["chosen"]) in [sorted(c) for c in checked]
    # A resumed command reuses the stored outcome instead of validating again.
    search(compose_config([*BASE, f"storage=sqlite:///{db}", f"mapping_path={mapping}"]))
    assert "validation (stored)" in capsys.readouterr().out


@pytest.mark.timeout(600)
def test_validation_can_be_switched_off(tmp_path) -> None:
    db, mapping = tmp_path / "s.db", tmp_path / "map.yaml"
    cfg = compose_config([*BASE, "search.validation_candidates=0", f"storage=sqlite:///{db}", f"mapping_path={mapping}"])
    result = search(cfg)
    entry = yaml.safe_load(mapping.read_text())["domains"]["translation"]
    assert "validation" not in entry
    assert entry["skip_set"] == sorted(result.best)
