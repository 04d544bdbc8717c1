"""What every command shares: Hydra entry, logging, and building model, drafter, domain,
evaluator from the composed configuration. Real work lives in plain functions taking a
config, so tests call them without Hydra."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from tss_opt.config import config_dir, register_configs
from tss_opt.errors import TSSError
from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.domains import Domain, available_domains, load_domain
from tss_opt.evaluation.drafters.base import Drafter
from tss_opt.models import LoadedModel, load_model
from tss_opt.storage.url import install_secret_filter, mask_secrets

log = logging.getLogger("tss_opt")


class UsageError(TSSError):
    """A configuration the user must fix; commands print it and exit with status 2."""


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
            task(cfg)
        except KeyboardInterrupt:
            _exit_interrupted()
        except (TSSError, ValueError, FileNotFoundError, KeyError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            if cfg.get("log_level") == "DEBUG":
                _print_traceback()
            print(f"error: {mask_secrets(str(msg))}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
        except Exception:
            _print_traceback()
            sys.exit(1)

    def main() -> None:
        try:
            _app()
        except KeyboardInterrupt:  # during composition or model loading
            _exit_interrupted()

    return main


def _exit_interrupted() -> None:
    print(INTERRUPTED, file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)


def _print_traceback() -> None:
    import traceback

    print(mask_secrets(traceback.format_exc()), file=sys.stderr, end="")


def setup(cfg: DictConfig) -> None:
    import warnings

    import optuna

    logging.getLogger("tss_opt").setLevel(cfg.get("log_level", "INFO"))
    # Hydra has configured the console and run-log handlers: no line they write shows a
    # storage password.
    install_secret_filter()
    # Our own progress lines say per trial what Optuna's INFO lines repeat.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))


def model_config(cfg: DictConfig) -> DictConfig:
    """``model`` with the top-level ``device=`` / ``dtype=`` shortcuts applied."""
    mc = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(mc, dict)
    if cfg.get("device"):
        mc["device"] = cfg.device
    if cfg.get("dtype"):
        mc["dtype"] = cfg.dtype
    return OmegaConf.create(mc)


def require_domain(cfg: DictConfig) -> Domain:
    if cfg.get("domain") is None:
        names = available_domains([config_dir()])
        raise UsageError(f"no domain chosen; add +domain=NAME (available: {', '.join(names)})")
    domain_cfg = OmegaConf.to_container(cfg.domain, resolve=True)
    return load_domain(domain_cfg)


def max_new_tokens_for(cfg: DictConfig, domain: Domain) -> int:
    """New tokens per prompt: ``max_new_tokens=``, else ``search.max_new_tokens``, else the
    domain's. An explicit 0 or negative value is an error, never a silent default."""
    for key, value in (("max_new_tokens", cfg.get("max_new_tokens")), ("search.max_new_tokens", cfg.search.get("max_new_tokens"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(
                f"{key}={value!r} is invalid; expected an integer >= 1 (tokens generated per prompt), "
                f"or null for the domain's {domain.config.max_new_tokens}"
            )
        return int(value)
    return int(domain.config.max_new_tokens)


def check_prompts(value: Any, key: str = "search.prompts") -> int | None:
    """``search.prompts`` checked: ``None`` (the domain's count) or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{key}={value!r} is invalid; expected an integer >= 1, or null for the domain's count")
    return int(value)


def drafter_config(cfg: DictConfig) -> dict[str, Any]:
    """The chosen drafter's settings, or the model's default drafter's (``conf/drafter/``)."""
    if cfg.get("drafter") is not None:
        out = OmegaConf.to_container(cfg.drafter, resolve=True)
    else:
        from hydra import compose
        from hydra.core.global_hydra import GlobalHydra

        name = cfg.model.default_drafter
        if GlobalHydra.instance().is_initialized():
            out = OmegaConf.to_container(compose(config_name=f"drafter/{name}").drafter, resolve=True)
        else:
            out = OmegaConf.to_container(OmegaConf.load(config_dir() / "drafter" / f"{name}.yaml"), resolve=True)
    assert isinstance(out, dict)
    return out


@dataclass
class Runtime:
    """A loaded target with its drafter factory: what decoding commands need."""

    loaded: LoadedModel
    target: TargetModel
    drafter_cfg: dict[str, Any]

    def new_drafter(self) -> Drafter | None:
        from tss_opt.evaluation.drafters.registry import build_drafter

        return build_drafter(self.drafter_cfg, self.target, self.loaded)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.loaded.model.generation_config.eos_token_id
        if ids is None:
            ids = self.loaded.tokenizer.eos_token_id
        return [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))


def load_runtime(cfg: DictConfig) -> Runtime:
    loaded = load_model(model_config(cfg))
    target = TargetModel(loaded.model, layers_path=loaded.config.layers_path, max_context=loaded.config.max_context)
    return Runtime(loaded=loaded, target=target, drafter_cfg=drafter_config(cfg))


def build_evaluator(cfg: DictConfig, runtime: Runtime | None = None, split: str | None = None, prompts: int | None = None) -> Any:
    """The default evaluator (``evaluator._target_``): speculative decoding over the domain's
    split with the configured model and drafter."""
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator

    domain = require_domain(cfg)
    rt = runtime or load_runtime(cfg)
    split = split or cfg.split
    examples = domain.split(split)
    n = prompts if prompts is not None else check_prompts(cfg.search.get("prompts"))
    if n is not None:  # a preset's prompt count is an upper bound (a small user domain has fewer)
        examples = examples[:n]
    max_new = max_new_tokens_for(cfg, domain)
    return SpecDecodeEvaluator(
        rt.target,
        rt.loaded.tokenizer,
        rt.new_drafter,
        examples,
        domain.metric,
        extra_metrics=domain.extra_metrics,
        max_new_tokens=int(max_new),
        scope=cfg.scope,
        temperature=cfg.temperature,
        cost=cfg.cost,
        eos_token_ids=rt.eos_token_ids,
        system_prompt=domain.config.system_prompt,
    )
