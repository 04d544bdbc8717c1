"""``python -m tss_opt.cli.train_drafter +domain=NAME drafter=eagle [train.max_minutes=30]``

Trains a drafter for the loaded target by self-distillation on the domain's training text
(calibration prompts, extra ``train_data`` records, the target's greedy continuations; never
validation or held-out prompts) and writes a checkpoint under
``<train.out_dir>/<model>/<domain>/`` that ``drafter=eagle drafter.checkpoint=PATH`` loads.

``train.general=true`` (no ``+domain``) trains one head on every domain together, saved under
``<model>/general/``; ``train.domains=[a,b]`` trains one head on those domains, saved under
``<model>/a+b/``. ``drafter.checkpoint=PATH`` writes the checkpoint to PATH instead.
``train.generated_tokens=N`` adds about N tokens of text the target samples itself from the
training prompts and generic chat prompts (data-free distillation), and the checkpoint keeps
the ``train.draft_vocab`` most frequent tokens as its draft vocabulary. ``drafter=t2d`` trains
T2D instead (the target's kept layers searched and distilled). Settings: ``train.*``
(tss_opt/config/train.py, docs/drafters.md).

The command reads the configuration into a :class:`~tss_opt.training.job.TrainingJob` and runs
the trainer :mod:`tss_opt.training.trainers` has for the drafter's builder.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly import assemble, drafter_config, require_domain
from tss_opt.cli.common import EXIT_INTERRUPTED, hydra_entry
from tss_opt.config.train import TrainSettings
from tss_opt.errors import UsageError


def train_settings(cfg: DictConfig) -> TrainSettings:
    """``cfg.train`` as a checked :class:`TrainSettings`."""
    from tss_opt.training.common import check_settings

    node = cfg.get("train")
    settings = OmegaConf.to_object(node) if node is not None else TrainSettings()
    if not isinstance(settings, TrainSettings):  # a plain mapping (configs composed without the schema)
        settings = TrainSettings(**dict(settings))
    check_settings(settings)
    return settings


def training_domains(cfg: DictConfig, settings: TrainSettings) -> tuple[str, list[Any]]:
    """``(label, domains)``: the ``+domain`` alone, or the domains of a multi-domain head
    (:func:`~tss_opt.training.job.choose_domains`)."""
    from tss_opt.config.search_path import domain_config_dirs
    from tss_opt.training.job import choose_domains

    chosen = require_domain(cfg) if cfg.get("domain") is not None else None
    return choose_domains(settings, chosen, domain_config_dirs())


def train_drafter(cfg: DictConfig) -> Any:
    """Train the chosen drafter with its trainer; returns the trainer's result."""
    from tss_opt.training import TrainingInterrupted
    from tss_opt.training.job import TrainingJob
    from tss_opt.training.trainers import drafter_trainer, trainable_drafters

    settings = train_settings(cfg)
    drafter = drafter_config(cfg)
    trainer = drafter_trainer(drafter) if cfg.get("drafter") is not None else None
    if trainer is None:
        trainable = trainable_drafters()
        raise UsageError(
            f"train_drafter trains drafter={' or drafter='.join(trainable)}; got drafter={drafter.get('name')!r}"
            + (f" (the model's default; add drafter={trainable[0]})" if cfg.get("drafter") is None else "")
        )
    label, domains = training_domains(cfg, settings)
    # Training keeps the search's precision (float32 on CPU) under dtype=auto.
    job = TrainingJob(
        label=label, domains=domains, settings=settings, drafter=drafter, load=lambda: assemble(cfg, "search")
    )
    try:
        return trainer(job)
    except TrainingInterrupted as e:
        print(
            f"interrupted at step {e.steps}; the checkpoint {e.checkpoint} holds the head as of then "
            "(loadable); add train.resume=true to the same command to continue from it",
            file=sys.stderr,
        )
        sys.exit(EXIT_INTERRUPTED)


main = hydra_entry(train_drafter)

if __name__ == "__main__":
    main()
