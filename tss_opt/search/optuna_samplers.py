"""Optuna's own samplers for the ``tpe``, ``nsga2`` and ``gp`` strategies, with the barrier
layers held at ``False`` (the registry, :mod:`tss_opt.search.registry`, names them)."""

from __future__ import annotations

import warnings

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler

__all__ = ["OPTUNA_SAMPLERS", "make_sampler", "with_barriers"]

# mode -> what builds its sampler (seed, budget).
OPTUNA_SAMPLERS = ("tpe", "nsga2", "gp")


def make_sampler(mode: str, seed: int, max_trials: int) -> BaseSampler:
    """Optuna's sampler for ``mode``.

    The samplers see the search's constraints through ``Trial.set_constraint`` (what the
    objective writes; Optuna 5 reads them and deprecates ``constraints_func``).

    Startup (random) trials: Optuna's defaults capped at a quarter of the budget, so small
    budgets still reach the model-based phase; NSGA-II's population likewise.
    """
    startup = max(1, min(10, max_trials // 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        if mode == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
        if mode == "nsga2":
            return optuna.samplers.NSGAIISampler(
                seed=seed, population_size=max(4, min(50, max_trials // 4))
            )
        if mode == "gp":
            try:
                import scipy  # noqa: F401
                import torch  # noqa: F401
            except ImportError as e:  # GPSampler needs both
                raise ValueError(
                    f"mode='gp' needs scipy and torch ({e}); install them or pick tpe / nsga2."
                ) from e
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    raise ValueError(f"Unknown Optuna strategy {mode!r}; expected one of: {', '.join(OPTUNA_SAMPLERS)}.")


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
