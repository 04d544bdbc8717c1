"""A real search with the replay evaluator on the tiny model: ``group_size=4`` (claims grouped,
chunked evaluation with early and futility stopping, stopped sets dropping out of a group)
stores the same trials' values and gives the same answer as ``group_size=1``."""

from __future__ import annotations

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from tss_opt.config import config_dir
from tss_opt.decoding.drafters import PromptLookupDrafter
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import load_domain
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.evaluation.replay import ReplayEvaluator
from tss_opt.search import run_search


class _CountingReplay(ReplayEvaluator):
    """Records how many skip sets each grouped call carried."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group_sizes: list[int] = []

    def evaluate_group(self, skips, prompt_ids=None):
        self.group_sizes.append(len(skips))
        return super().evaluate_group(skips, prompt_ids)


@pytest.fixture(scope="module")
def qa():
    return load_domain(OmegaConf.load(config_dir() / "domain" / "qa.yaml"))


def _stored(url: str, name: str) -> dict[tuple[int, ...], tuple]:
    trials = optuna.load_study(study_name=name, storage=url).get_trials()
    return {
        tuple(t.user_attrs["skip_set"]): (t.values, t.user_attrs.get("prompts_used"), t.user_attrs.get("per_prompt"))
        for t in trials if t.state == TrialState.COMPLETE
    }


def test_grouped_replay_search_equals_one_at_a_time(tiny, qa, tmp_path):
    prompts = PromptSet(qa.split("calibration")[:8], qa.metric, DecodeProtocol(max_new_tokens=8, eos_token_ids=(258,)))
    ev = _CountingReplay(
        TargetModel(tiny.model), tiny.tokenizer, lambda: PromptLookupDrafter(num_tokens=4), prompts,
        batch_size=4, show_progress=False,
    )
    settings = dict(
        mode="exhaustive", max_depth=2, early_stopping=True, early_stop_chunk=2, futility_stopping=True,
        feasibility="paired", show_progress=False,
    )
    one, four = f"sqlite:///{tmp_path / 'one.db'}", f"sqlite:///{tmp_path / 'four.db'}"
    r1 = run_search(ev, storage=one, study_name="s", group_size=1, **settings)
    assert set(ev.group_sizes) == {1}
    ev.group_sizes.clear()
    r4 = run_search(ev, storage=four, study_name="s", group_size=4, **settings)
    assert max(ev.group_sizes) == 4  # level 1 (4 single layers) ran as one group
    assert _stored(one, "s") == _stored(four, "s")
    assert r4.best == r1.best and r4.pareto == r1.pareto and r4.pool == r1.pool
    assert [(lv.level, lv.evaluated, lv.feasible) for lv in r4.levels] == [
        (lv.level, lv.evaluated, lv.feasible) for lv in r1.levels
    ]
