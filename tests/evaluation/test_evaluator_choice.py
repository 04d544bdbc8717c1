"""``evaluator=auto``: replay exactly where it reproduces the engine, the engine otherwise, and
one log line saying why.

Real drafters (built by the shipped builders) and the tiny random model; the built auto
evaluator is checked against ``evaluator=engine`` figure by figure.
"""

from __future__ import annotations

import logging

import pytest
import torch

from tss_opt.assembly import Assembly, build_evaluator, compose_config
from tss_opt.decoding.drafters.registry import build_drafter
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.choice import EXACT_BATCHING, EvaluatorChoice, choose_evaluator, runs_replay
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
from tss_opt.evaluation.replay import ReplayEvaluator
from tss_opt.search.memo import MemoEvaluator

TR15 = "builtin:token_recycle_15.json"
EXACT = dict(temperature=0.0, cost="analytic", device="cpu", dtype=torch.float32, verification="exact")


def _choose(drafter="pld", **over):
    drafters = {
        # Model-free builders at fixed sizes (the default, auto, sizes them on the target).
        "pld": lambda: build_drafter({"name": "pld", "num_tokens": 10}, None, None),  # type: ignore[arg-type]
        "token_recycle": lambda: build_drafter({"name": "token_recycle", "template": TR15}, None, None),  # type: ignore[arg-type]
        "samd": lambda: build_drafter({"name": "samd", "num_tokens": 10, "template": TR15}, None, None),  # type: ignore[arg-type]
        "samd_none": lambda: build_drafter({"name": "samd", "num_tokens": 10, "fallback": "none"}, None, None),  # type: ignore[arg-type]
        "none": lambda: None,
    }
    return choose_evaluator(**{**EXACT, **over}, drafter=drafters[drafter](), drafter_name=drafter.split("_none")[0])


@pytest.mark.parametrize("drafter", ["pld", "samd_none", "none"])
def test_replay_where_exact(drafter):
    c = _choose(drafter)
    assert c.kind == "replay", c.reason
    assert c.message.startswith("evaluator=auto: replay, because it reproduces the engine exactly here")
    assert "float32 on cpu batches exactly" in c.message
    assert _choose(drafter, dtype="float64").kind == "replay"  # names work as well as dtypes


@pytest.mark.parametrize(
    ("over", "drafter", "says"),
    [
        ({}, "token_recycle", "drafter token_recycle is not replayable (evaluator=replay cannot reproduce Token Recycling"),
        ({}, "samd", "drafter samd is not replayable (evaluator=replay cannot reproduce SAMD's Token Recycling fallback"),
        ({"temperature": 0.7}, "pld", "temperature=0.7 samples"),
        ({"cost": "measured"}, "pld", "cost=measured times real decoding"),
        ({"verification": "diversed"}, "pld", "verification=diversed is lossy"),
        ({"dtype": torch.bfloat16}, "pld", "bfloat16 on cpu is not known to batch exactly"),
        ({"dtype": "float16"}, "pld", "float16 on cpu is not known to batch exactly"),
        ({"device": "cuda:0"}, "pld", "float32 on cuda is not known to batch exactly"),
    ],
)
def test_engine_otherwise_with_the_reason(over, drafter, says):
    c = _choose(drafter, **over)
    assert c.kind == "engine"
    assert c.message.startswith("evaluator=auto: engine, because ")
    assert says in c.reason
    assert ";" not in c.reason  # exactly one condition failed: exactly one clause


def test_every_failed_condition_is_named_on_one_line():
    c = _choose("token_recycle", temperature=1.0, cost="measured", dtype=torch.bfloat16)
    assert c.kind == "engine" and "\n" not in c.message
    assert [p.split(" ")[0] for p in c.reason.split("; ")] == ["temperature=1.0", "cost=measured", "drafter", "bfloat16"]


def test_exact_batching_table_is_data():
    assert ("cpu", torch.float32) in EXACT_BATCHING
    assert not {d for _, d in EXACT_BATCHING} & {torch.bfloat16, torch.float16}
    with pytest.raises(ValueError, match="dtype='fp8' is not a torch dtype"):
        _choose(dtype="fp8")


def test_an_unknown_drafter_class_runs_the_engine():
    from tss_opt.decoding.drafter import Drafter, DrafterCapabilities
    from tss_opt.decoding.tree import DraftTree

    class Mine(Drafter):  # a user's drafter that declares nothing: not known to be replayable
        def propose(self, context: torch.Tensor) -> DraftTree:
            return DraftTree.empty()

    class MineReplayable(Mine):
        capabilities = DrafterCapabilities(replayable=True)

    c = choose_evaluator(**EXACT, drafter=Mine(), drafter_name="mine")
    assert c.kind == "engine" and "drafter mine is not replayable" in c.reason
    assert choose_evaluator(**EXACT, drafter=MineReplayable(), drafter_name="mine").kind == "replay"


# --- built from the configuration -----------------------------------------------------------------


def _runtime(loaded, drafter_cfg):
    return Assembly(loaded=loaded, target=TargetModel(loaded.model), drafter_cfg=drafter_cfg)


BASE = ["+domain=qa", "+model=tiny", "search.prompts=3", "max_new_tokens=8"]


def test_auto_is_the_default_and_logs_its_choice(tiny64, caplog):
    cfg = compose_config(BASE)
    assert cfg.evaluator.kind == "auto"
    with caplog.at_level(logging.INFO, logger="tss_opt.evaluation.choice"):
        ev = build_evaluator(cfg, runtime=_runtime(tiny64, {"name": "pld"}))
    assert isinstance(ev, ReplayEvaluator) and ev.num_prompts == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "tss_opt.evaluation.choice"]
    assert len(lines) == 1 and lines[0].startswith("evaluator=auto: replay, because")
    assert runs_replay(ev) and runs_replay(MemoEvaluator(ev))

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tss_opt.evaluation.choice"):
        ev = build_evaluator(cfg, runtime=_runtime(tiny64, {"name": "token_recycle"}))
    assert type(ev) is SpecDecodeEvaluator and not runs_replay(MemoEvaluator(ev))
    lines = [r.getMessage() for r in caplog.records if r.name == "tss_opt.evaluation.choice"]
    assert len(lines) == 1 and lines[0].startswith("evaluator=auto: engine, because drafter token_recycle is not replayable")


@pytest.mark.parametrize(
    ("overrides", "kind"),
    [([], "replay"), (["cost=measured"], "engine"), (["temperature=0.5"], "engine"), (["dtype=bfloat16"], "engine")],
)
def test_the_configuration_decides(tiny, overrides, kind):
    cfg = compose_config(BASE + overrides)
    loaded = tiny
    if overrides == ["dtype=bfloat16"]:
        from tss_opt.assembly import model_config
        from tss_opt.models import load_model

        loaded = load_model(model_config(cfg))
        assert loaded.model.dtype == torch.bfloat16
    ev = build_evaluator(cfg, runtime=_runtime(loaded, {"name": "pld"}))
    assert isinstance(ev, ReplayEvaluator) == (kind == "replay")
    assert isinstance(ev, SpecDecodeEvaluator) == (kind == "engine")


def test_auto_gives_the_engine_figures(tiny64):
    """Where auto picks the replay, its per-prompt figures equal evaluator=engine's (float64:
    no argmax near-ties in the random model), for a model-backed drafter too."""
    for drafter_cfg in ({"name": "pld"}, {"name": "self", "skip": [1, 2]}):
        rt = _runtime(tiny64, drafter_cfg)
        assert choose_evaluator(**{**EXACT, "dtype": tiny64.model.dtype}, drafter=build_drafter({"name": "self", "skip": [1, 2], "num_tokens": 5}, rt.target, tiny64)).kind == "replay"
        auto = build_evaluator(compose_config(BASE), runtime=rt)
        engine = build_evaluator(compose_config(BASE + ["evaluator=engine"]), runtime=rt)
        assert isinstance(auto, ReplayEvaluator) and isinstance(engine, SpecDecodeEvaluator)
        for skip in (frozenset(), frozenset({1})):
            a, e = auto(skip), engine(skip)
            keys = ("accept_length", "metric", "tokens", "steps")
            assert [{k: p[k] for k in keys} for p in a["per_prompt"]] == [{k: p[k] for k in keys} for p in e["per_prompt"]]
            assert a["accept_length"] == e["accept_length"] and a["metric"] == e["metric"]


def test_choice_is_a_frozen_value():
    c = EvaluatorChoice("engine", "x")
    with pytest.raises(AttributeError):
        c.kind = "replay"  # type: ignore[misc]


def test_compare_hides_the_replay_speed_when_auto_ran_the_replay(tiny64):
    """compare/sweep blank calibration tok/s when auto chose the replay, not when it chose the engine."""
    from omegaconf import OmegaConf

    from tss_opt.cli.compare import REPLAY_NOTE, hide_replay_speed
    from tss_opt.report.compare import ComparisonRow

    def row() -> ComparisonRow:
        return ComparisonRow(label="beam", study_name="s", skip_set=[3], sparsity=0.1,
                             calibration={"accept_length": 2.0, "metric": 0.1, "tokens_per_s": 49.3}, curve=[])

    cfg = OmegaConf.create({"evaluator": {"kind": "auto"}})
    full = compose_config(BASE)
    replay = MemoEvaluator(build_evaluator(full, "auto", runtime=_runtime(tiny64, {"name": "pld"})))
    engine = MemoEvaluator(build_evaluator(full, "auto", runtime=_runtime(tiny64, {"name": "token_recycle"})))
    r, e = row(), row()
    assert hide_replay_speed(cfg, [r], replay) == REPLAY_NOTE and r.calibration["tokens_per_s"] is None
    assert hide_replay_speed(cfg, [e], engine) == "" and e.calibration["tokens_per_s"] == 49.3


@pytest.mark.parametrize(
    ("drafter", "line"),
    [
        ("pld", "evaluator=auto: replay, because it reproduces the engine exactly here"),
        ("token_recycle", "evaluator=auto: engine, because drafter token_recycle is not replayable"),
    ],
)
def test_the_search_command_says_which_and_why(tmp_path, drafter, line):
    """A real search command (tiny model, 2 prompts, level 1) logs the choice once."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "tss_opt", "+domain=qa", "+model=tiny", f"drafter={drafter}", "search.prompts=2",
         "max_new_tokens=4", "search.max_depth=1", "search.early_barrier=0", "search.latter_barrier=0",
         "search.validation_candidates=0", f"storage=sqlite:///{tmp_path}/s.db", f"mapping_path={tmp_path}/map.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert sum(line in x for x in out.splitlines()) == 1, out[-3000:]
    assert "level 1 complete: evaluated 4/4" in out
