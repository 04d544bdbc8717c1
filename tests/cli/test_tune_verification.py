"""``python -m tss_opt.cli.tune_verification`` on the tiny model: the table, the saved learned
parameters, the mapping entry marked lossy (or left unchanged when exact is kept), bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tss_opt.assembly import compose_config
from tss_opt.cli.tune_verification import tune_verification
from tss_opt.decoding.verify.relaxed import RelaxedVerificationError
from tss_opt.errors import UsageError
from tss_opt.mapping import MappingEntry, load_mapping, write_entry

REPO = Path(__file__).resolve().parents[2]
TINY_ID = "tiny-llama-4l-seed0"
COMMON = [
    "+model=tiny", "+domain=qa", "drafter=self", "drafter.skip=[1,2]", "drafter.num_tokens=3", "search.prompts=3",
    "max_new_tokens=8", "relaxed.epochs=1", "relaxed.weights=[1.0,0.0]", "log_level=WARNING",
]


def _entry(skip=(3,)) -> MappingEntry:
    return MappingEntry(
        domain="qa", skip_set=tuple(skip), accept_length=1.2, metric=0.0, metric_name="token_f1", cost=0.6,
        sparsity=len(skip) / 4, baseline={"accept_length": 1.0, "metric": 0.0, "cost": 1.0}, model=TINY_ID,
        num_layers=4, drafter="self", study={"name": "qa.tiny", "storage": "sqlite:///x.db"}, selection="min_cost",
    )


@pytest.fixture()
def mapped(tmp_path) -> Path:
    path = tmp_path / "mapping.yaml"
    write_entry(path, _entry())
    return path


def _cfg(tmp_path, mapping, *extra):
    return compose_config([*COMMON, f"mapping_path={mapping}", f"relaxed.out_dir={tmp_path / 'relaxed'}", *extra])


@pytest.mark.parametrize("mode", ["diversed", "cospec"])
def test_lossy_choice_is_written_into_the_entry(tmp_path, mapped, capsys, mode):
    # The tiny model scores 0 on every prompt: every rule keeps the metric, so the relaxed
    # rule with the highest accepted length wins over exact.
    # The tiny model's flat distributions never pass the default thresholds: keep-always ones.
    taus = ["relaxed.tau_draft=0.0", "relaxed.tau_target=0.0"] if mode == "cospec" else []
    choice = tune_verification(_cfg(tmp_path, mapped, f"verification={mode}", *taus))
    out = capsys.readouterr().out
    assert "| candidate | verification |" in out and "**yes**" in out and "LOSSY" in out
    assert choice.lossy and choice.skip == frozenset({3})
    kind = "diversed_weight" if mode == "diversed" else "cospec_policy"
    assert (tmp_path / "relaxed" / "tiny" / f"qa.{kind}.json").is_file()
    entry = load_mapping(mapped).entry_for("qa")
    assert entry.lossy and entry.verification == choice.chosen.label
    assert entry.relaxed["mode"] == mode and entry.relaxed["chosen"] == choice.chosen.name
    assert entry.skip_set == (3,) and entry.accept_length == 1.2  # the search's figures stay
    raw = yaml.safe_load(mapped.read_text())["domains"]["qa"]
    assert raw["lossy"] is True and raw["metric_change"] == pytest.approx(choice.chosen.judged.metric_change)


def test_exact_kept_leaves_the_entry_unchanged(tmp_path, mapped, capsys):
    before = mapped.read_text()
    # A tolerance nothing can meet (the metric must rise by 0.1): exact is the fallback.
    cfg = _cfg(tmp_path, mapped, "verification=diversed", "search.relative=false", "search.eps_metric=-0.1")
    choice = tune_verification(cfg)
    assert not choice.lossy and "entry unchanged" in capsys.readouterr().out
    assert mapped.read_text() == before


def test_other_skip_set_is_tuned_but_not_written(tmp_path, mapped, capsys):
    before = mapped.read_text()
    tune_verification(_cfg(tmp_path, mapped, "verification=diversed", "skip=[2]"))
    assert "was not changed" in capsys.readouterr().out and mapped.read_text() == before


def test_bad_input(tmp_path, mapped):
    with pytest.raises(UsageError, match="verification=diversed or verification=cospec"):
        tune_verification(_cfg(tmp_path, mapped))
    pld = [o for o in COMMON if not o.startswith("drafter")] + ["drafter=pld", "verification=cospec", f"mapping_path={mapped}"]
    with pytest.raises(RelaxedVerificationError, match="'pld'.*draft_model, eagle, self, t2d"):
        tune_verification(compose_config(pld))
    with pytest.raises(UsageError, match=r"give skip=\[...\]"):
        tune_verification(_cfg(tmp_path, tmp_path / "none.yaml", "verification=diversed"))
    with pytest.raises(RelaxedVerificationError, match=r"\[0, 1\]"):
        tune_verification(_cfg(tmp_path, mapped, "verification=diversed", "relaxed.weights=[1.5]"))


def test_command_runs(tmp_path, mapped):
    r = subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.tune_verification", *COMMON, "verification=diversed",
         f"mapping_path={mapped}", f"relaxed.out_dir={tmp_path / 'relaxed'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "chosen:" in r.stdout and load_mapping(mapped).entry_for("qa").lossy
