"""One drafter-training run as plain values: what it trains on, where it writes, how the target
is loaded (:class:`TrainingJob`, the argument of every trainer in
:mod:`tss_opt.training.trainers`), and the choices every trainer shares: which domains
(:func:`choose_domains`) and which probe prompts (:func:`probe_prompts`).

``python -m tss_opt.cli.train_drafter`` builds the job from the composed configuration; the
library below never sees the configuration.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tss_opt.config.drafters import MISSING
from tss_opt.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from tss_opt.config.train import TrainSettings
    from tss_opt.decoding.target import TargetModel
    from tss_opt.evaluation.domains import Domain
    from tss_opt.models.loading import LoadedModel

__all__ = ["GENERAL", "TrainingJob", "TrainingTarget", "choose_domains", "probe_prompts"]

GENERAL = "general"
"""The label (and output folder) of one drafter trained on every known domain."""


class TrainingTarget(Protocol):
    """The loaded target a trainer distils from (the commands' ``Assembly`` is one)."""

    @property
    def loaded(self) -> LoadedModel: ...

    @property
    def target(self) -> TargetModel: ...

    @property
    def eos_token_ids(self) -> list[int]: ...


@dataclass(frozen=True)
class TrainingJob:
    """One training run.

    Attributes:
        label: Names the run's domains in the output path and the summary: the domain's
            name, :data:`GENERAL` for every domain, or ``a+b`` for a list.
        domains: The domains whose training text is used (calibration prompts and extra
            records; never validation or held-out prompts).
        settings: The ``train.*`` settings (checked).
        drafter: The drafter's config (its name, output path and, for T2D, ``train``).
        load: Loads the target; a trainer calls it once, after the training text is known
            to exist (a domain without text fails before a model is loaded).
        echo: Where the summary lines go (the command prints them).
    """

    label: str
    domains: Sequence[Domain]
    settings: TrainSettings
    drafter: Mapping[str, Any]
    load: Callable[[], TrainingTarget]
    echo: Callable[[str], None] = print

    def given_path(self, *keys: str) -> Path | None:
        """The first of the drafter's ``keys`` (e.g. ``checkpoint``, ``path``) that is set, as a path."""
        for key in keys:
            value = self.drafter.get(key)
            if value and value != MISSING:
                return Path(str(value))
        return None


def choose_domains(
    settings: TrainSettings, chosen: Domain | None, config_dirs: Sequence[str | os.PathLike[str]]
) -> tuple[str, list[Domain]]:
    """``(label, domains)``: the chosen domain alone, or the domains of a multi-domain drafter.

    Args:
        settings: ``train.general`` (every domain) and ``train.domains`` (a list).
        chosen: The ``+domain`` of the command, loaded (``None``: none given).
        config_dirs: Where domain configs are looked up.

    Raises:
        UsageError: no domain chosen, ``+domain`` together with ``train.general`` or
            ``train.domains``.
        DomainError: an unknown domain name.
    """
    from tss_opt.evaluation.domains import available_domains, load_domain, read_domain_config

    known = available_domains(config_dirs)
    many = bool(settings.general or settings.domains)
    if chosen is not None:
        if many:
            raise UsageError(
                "+domain=NAME trains a head for one domain; train.general / train.domains train one head "
                "on several: give one or the other"
            )
        return chosen.name, [chosen]
    if not many:
        raise UsageError(
            f"no domain chosen; add +domain=NAME (available: {', '.join(known)}), or train.general=true "
            "for one head on every domain"
        )
    names = list(dict.fromkeys(str(n) for n in settings.domains)) or known
    domains = [load_domain(read_domain_config(n, config_dirs)) for n in names]
    label = GENERAL if sorted(names) == sorted(known) else "+".join(names)
    return label, domains


def probe_prompts(domains: Sequence[Domain], tokenizer: Any, n: int) -> list[torch.Tensor]:
    """``n`` calibration prompts (each ``torch.LongTensor`` of shape ``(P,)``, chat-formatted),
    round-robin over the domains; never a validation or held-out prompt."""
    from tss_opt.evaluation.domains import format_prompt

    queues = [d.split("calibration") for d in domains]
    out = []
    i = 0
    while len(out) < n and any(queues):
        q = queues[i % len(queues)]
        if q:
            ex = q.pop(0)
            out.append(format_prompt(tokenizer, ex, domains[i % len(queues)].config.system_prompt))
        i += 1
    return out
