"""Optuna's own samplers for the Optuna-driven modes (``tpe``, ``nsga2``, ``gp``), with the
barrier layers held at ``False``. Which mode uses which sampler is declared on the mode
(``ModeSpec.sampler``, :mod:`tss_opt.config.search`); this module builds each sampler."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler

__all__ = ["SAMPLER_BUILDERS", "startup_trials", "with_barriers"]


def startup_trials(max_trials: int) -> int:
    """Startup (random) trials: Optuna's default (10) capped at a quarter of the budget, so
    small budgets still reach the model-based phase."""
    return max(1, min(10, max_trials // 4))


def _tpe(seed: int, max_trials: int) -> BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials(max_trials))


def _nsga2(seed: int, max_trials: int) -> BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        # NSGA-II's population, like the startup trials, capped at a quarter of the budget.
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, max_trials // 4)))


def _gp(seed: int, max_trials: int) -> BaseSampler:
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:  # GPSampler needs both
        raise ValueError(f"mode='gp' needs scipy and torch ({e}); install them or pick tpe / nsga2.") from e
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials(max_trials))


# ModeSpec.sampler (an optuna.samplers class name) -> ``builder(seed, max_trials)``.
# The samplers see the search's constraints through ``Trial.set_constraint`` (what the
# objective writes; Optuna 5 reads them and deprecates ``constraints_func``).
SAMPLER_BUILDERS: Mapping[str, Callable[[int, int], BaseSampler]] = {
    "TPESampler": _tpe,
    "NSGAIISampler": _nsga2,
    "GPSampler": _gp,
}


class _Barriers(BaseSampler):
    """Delegates to ``base`` but holds the barrier layers' ``skip_<i>`` at ``False``."""

    def __init__(self, base: BaseSampler, fixed: set[str]) -> None:
        self.base = base
        self.fixed = fixed

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        space = self.base.infer_relative_search_space(study, trial)
        return {k: v for k, v in space.items() if k not in self.fixed}

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):  # type: ignore[no-untyped-def]
        if param_name in self.fixed:
            return False
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):  # type: ignore[no-untyped-def]
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):  # type: ignore[no-untyped-def]
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


def with_barriers(base: BaseSampler, fixed: set[str]) -> BaseSampler:
    """``base``, with the parameters in ``fixed`` (barrier layers) held at ``False``."""
    return _Barriers(base, fixed) if fixed else base
