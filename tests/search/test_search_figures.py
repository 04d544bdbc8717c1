"""Every figure in the search's tables says what it measured: a speed column only
where decoding was timed, the evaluator named, in the printed summary and the dashboard note."""

from __future__ import annotations

from typing import Any

from search_landscape import Landscape

from tss_opt.cli.search import format_result
from tss_opt.search import load_result, run_search
from tss_opt.search.note import format_note


class Labelled(Landscape):
    """The landscape, answering as the shipped evaluators do (``evaluator``, ``cost_kind``); the
    replay names its throughput ``replay_tokens_per_s``; ``None`` answers as a user's evaluator."""

    def __init__(self, kind: str | None) -> None:
        super().__init__(num_layers=5, seed=1)
        self.kind = kind

    def measure(self, skip: frozenset[int]) -> dict[str, Any]:
        out = super().measure(skip)
        if self.kind is None:
            return out
        out.update(evaluator=self.kind, cost_kind="analytic")
        if self.kind == "replay":
            out["replay_tokens_per_s"] = out.pop("tokens_per_s")
        return out


def _summary(tmp_path, kind: str | None):
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = run_search(Labelled(kind), storage=url, study_name="figures", max_depth=2, feasibility="point",
                        show_progress=False)
    return result, format_result(result, 60.0), format_note(load_result(url, "figures")), url


def _header(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| configuration |"))


def test_replayed_trials_show_no_speed_and_say_why(tmp_path):
    result, printed, note, url = _summary(tmp_path, "replay")
    assert len(result.best) > 0 and result.evaluator == "replay"
    for text in (printed, note):
        assert _header(text) == "| configuration | skip set | accepted length | f1 | cost (analytic) |"
        assert "figures: evaluator=replay" in text and "no decoding was timed" in text
        assert "tok/s |" not in text
    # The dashboard: no trial carries a tokens_per_s attribute; the study's result names the evaluator.
    import optuna

    study = optuna.load_study(study_name="figures", storage=url)
    assert all("tokens_per_s" not in t.user_attrs and t.user_attrs["evaluator"] == "replay" for t in study.trials)
    assert study.user_attrs["result"]["evaluator"] == "replay"


def test_engine_trials_show_their_measured_speed_labelled(tmp_path):
    result, printed, note, _ = _summary(tmp_path, "engine")
    for text in (printed, note):
        assert _header(text).endswith("| cost (analytic) | tok/s (engine) |")
        assert "figures: evaluator=engine" in text
    dense = result.baseline["tokens_per_s"]
    assert f"| dense | [] | {result.baseline['accept_length']:.3f} |" in printed and f"| {dense:.2f} |" in printed


def test_a_users_evaluator_is_shown_as_reported(tmp_path):
    result, printed, _, _ = _summary(tmp_path, None)
    assert result.evaluator is None
    assert _header(printed).endswith("| cost | tok/s (as reported) |")
    assert "which evaluator is not recorded" in printed
