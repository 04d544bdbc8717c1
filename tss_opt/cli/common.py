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
from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.domains import Domain, available_domains, load_domain
from tss_opt.evaluation.drafters.base import Drafter
from tss_opt.models import LoadedModel, load_model

log = logging.getLogger("tss_opt")


class UsageError(ValueError):
    """A configuration the user must fix; commands print it and exit with status 2."""


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
        from tss_opt.config.search_path import domain_config_dirs

        names = available_domains(domain_config_dirs())
        raise UsageError(f"no domain chosen; add +domain=NAME (available: {', '.join(names)})")
    domain_cfg = OmegaConf.to_container(cfg.domain, resolve=True)
    return load_domain(domain_cfg)


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
    n = prompts if prompts is not None else cfg.search.get("prompts")
    if n is not None:  # a preset's prompt count is an upper bound (a small user domain has fewer)
        examples = examples[:n]
    max_new = cfg.get("max_new_tokens") or cfg.search.get("max_new_tokens") or domain.config.max_new_tokens
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
