"""What every command shares: the Hydra entry point, logging, and turning user errors into one
line and exit status 2. Building model, drafter, domain and evaluator is
:mod:`tss_opt.assembly`; the commands are thin wrappers over plain functions taking a config."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from tss_opt.config import config_dir, register_configs
from tss_opt.errors import UsageError

log = logging.getLogger("tss_opt")


def hydra_entry(task: Callable[[DictConfig], Any]) -> Callable[[], None]:
    """Wrap ``task(cfg)`` as a Hydra app over the shipped ``conf/``; user errors exit 2."""
    import hydra

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def _app(cfg: DictConfig) -> None:
        setup(cfg)
        try:
            task(cfg)
        except (UsageError, ValueError, FileNotFoundError, KeyError) as e:
            if cfg.get("log_level") == "DEBUG":
                raise
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            print(f"error: {msg}", file=sys.stderr)
            sys.exit(2)

    return _app


def setup(cfg: DictConfig) -> None:
    import warnings

    import optuna

    logging.getLogger("tss_opt").setLevel(cfg.get("log_level", "INFO"))
    # Our own progress lines say per trial what Optuna's INFO lines repeat.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))

# Configs written before tss_opt.assembly existed name this path as evaluator._target_.
from tss_opt.assembly import build_evaluator as build_evaluator  # noqa: E402
