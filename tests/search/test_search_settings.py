"""SearchSettings: defaults, validation messages, OmegaConf compatibility."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tss_opt.search import SearchSettings


def test_defaults_follow_the_paper() -> None:
    s = SearchSettings()
    assert (s.eps_accept, s.eps_metric, s.tau_accept, s.tau_metric) == (0.05,) * 4
    assert s.relative and s.mode == "exhaustive" and s.beam_width == 3
    assert s.selection == "min_cost" and s.max_trials is None
    assert (s.early_barrier, s.latter_barrier) == (0, 0)


def test_tolerance_messages() -> None:
    with pytest.raises(ValueError) as e:
        SearchSettings(eps_accept=1.5)
    assert str(e.value).startswith(
        "eps_accept=1.5 is out of range; expected 0 <= eps_accept < 1 when relative=True"
    )
    with pytest.raises(
        ValueError, match="tau_metric=-0.1 is out of range; expected tau_metric >= 0"
    ):
        SearchSettings(relative=False, tau_metric=-0.1)
    SearchSettings(relative=False, eps_accept=1.5)  # absolute: any drop >= 0 is allowed


def test_choices_and_barriers() -> None:
    with pytest.raises(
        ValueError, match="Unknown mode 'greedy'; expected one of: exhaustive, beam"
    ):
        SearchSettings(mode="greedy")
    with pytest.raises(ValueError, match="expected one of: min_cost, triple_win"):
        SearchSettings(selection="fastest")
    s = SearchSettings(early_barrier=2, latter_barrier=1)
    assert s.allowed_layers(6) == (2, 3, 4)
    with pytest.raises(
        ValueError,
        match=r"leave no layer of 3 to skip; expected early_barrier \+ latter_barrier <= 2",
    ):
        s.validate(num_layers=3)
    with pytest.raises(ValueError, match="beam_width=0 is invalid"):
        SearchSettings(beam_width=0)
    with pytest.raises(ValueError, match="grace_period=5 must exceed heartbeat_interval=10"):
        SearchSettings(heartbeat_interval=10, grace_period=5)


def test_omegaconf_structured_config() -> None:
    cfg = OmegaConf.structured(SearchSettings)
    cfg.mode = "beam"
    cfg.max_trials = 50
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, SearchSettings) and obj.mode == "beam" and obj.max_trials == 50
    cfg.eps_metric = 2.0  # the range is checked when the dataclass is built
    with pytest.raises(ValueError, match="eps_metric=2.0 is out of range"):
        OmegaConf.to_object(cfg)
    with pytest.raises(ValueError, match="Unknown search setting"):
        SearchSettings.from_mapping({"eps": 0.1})
