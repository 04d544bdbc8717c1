"""What every command shares: the Hydra entry point, logging, and turning user errors into one
line and exit status 2. Building model, drafter, domain and evaluator is
:mod:`tss_opt.assembly`; the commands are thin wrappers over plain functions taking a config."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from tss_opt.config import config_dir, register_configs
from tss_opt.errors import TSSError
from tss_opt.progress import bars_and_logs
from tss_opt.storage.url import install_secret_filter, mask_secrets

log = logging.getLogger("tss_opt")


INTERRUPTED = "interrupted; run the same command again to resume"
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def hydra_entry(task: Callable[[DictConfig], Any]) -> Callable[[], None]:
    """Wrap ``task(cfg)`` as a Hydra app over the shipped ``conf/``.

    A user error (:class:`~tss_opt.errors.TSSError` and the other ``ValueError``,
    ``FileNotFoundError``, ``KeyError``) prints one line ``error: ...`` and exits 2; Ctrl-C
    prints one line and exits 130; anything else prints its traceback and exits 1. Every line
    has URL passwords masked (Hydra's own "Error executing job with overrides" line, which
    would echo them, is never reached).
    """
    import hydra

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def _app(cfg: DictConfig) -> None:
        setup(cfg)
        try:
            # On a terminal, log lines are printed above the progress bars (tss_opt.progress).
            with bars_and_logs():
                task(cfg)
        except KeyboardInterrupt:
            _exit_interrupted()
        except Exception as e:
            if interrupted_by(e):
                _exit_interrupted()
            if not isinstance(e, (TSSError, ValueError, FileNotFoundError, KeyError)):
                _print_traceback()
                sys.exit(1)
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            if cfg.get("log_level") == "DEBUG":
                _print_traceback()
            print(f"error: {mask_secrets(str(msg))}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    def main() -> None:
        try:
            _app()
            # Everything is written: a Ctrl-C from here to the process's end (interpreter
            # shutdown, outside any handler) would otherwise end it by the signal (exit -2).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except KeyboardInterrupt:  # during composition or model loading
            _exit_interrupted()

    return main


def interrupted_by(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from, a Ctrl-C (``KeyboardInterrupt``).

    Python wraps what some hooks raise: a Ctrl-C that lands while a class is being created
    (a dataclass field's ``__set_name__``, during a lazy import) comes out of Python 3.11 as
    ``RuntimeError("Error calling __set_name__ ...")`` with the ``KeyboardInterrupt`` as its
    cause. It is still the user's Ctrl-C: exit 130, not a traceback and exit 1. Only the
    ``raise ... from`` chain counts: an error raised while handling a Ctrl-C (its
    ``__context__``) is a real failure, and keeps its traceback.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__
    return False


def _exit_interrupted() -> None:
    print(INTERRUPTED, file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)


def _print_traceback() -> None:
    import traceback

    print(mask_secrets(traceback.format_exc()), file=sys.stderr, end="")


class QuietInterrupt(logging.Filter):
    """Drops Optuna's "trial failed ... KeyboardInterrupt()" warning with its traceback, and the
    "Trial N failed with value None." line that follows every failed trial: Ctrl-C is reported
    by the command's one line (the trial is resumed, not counted as a crash), and a real
    failure keeps Optuna's first warning with the error and its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, KeyboardInterrupt):
            return False
        return not record.getMessage().endswith("failed with value None.")


def setup(cfg: DictConfig) -> None:
    import warnings

    import optuna

    logging.getLogger("tss_opt").setLevel(cfg.get("log_level", "INFO"))
    # Hydra has configured the console and run-log handlers: no line they write shows a
    # storage password.
    install_secret_filter()
    # Our own progress lines say per trial what Optuna's INFO lines repeat.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, QuietInterrupt) for f in handler.filters):
            handler.addFilter(QuietInterrupt())
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
