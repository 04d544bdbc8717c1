"""Building the server's router: fitted once on every known domain's calibration prompts and
cached next to the mapping file (``router.<model>.json``), reloaded while the model and the
prompts are unchanged."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tss_opt.runtime.background import BACKGROUND_PROMPTS
from tss_opt.runtime.router import DomainRouter, RouterError, domains_fingerprint

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.evaluation.domains import Domain

__all__ = ["load_or_fit_router", "router_cache_path", "router_domains"]

log = logging.getLogger(__name__)


def router_cache_path(mapping_path: str | os.PathLike[str], model_id: str) -> Path:
    """Where the fitted router of ``model_id`` is kept: next to the mapping file."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", model_id).strip("_").lower() or "model"
    return Path(mapping_path).with_name(f"router.{slug}.json")


def router_domains(extra: Iterable[str] = (), config_dirs: Sequence[str | os.PathLike[str]] | None = None) -> list[Domain]:
    """The domains of the config folders (``<dir>/domain/*.yaml``) plus ``extra`` names found
    there.

    Fitting on every known domain, mapped or not, keeps a prompt that resembles an unmapped
    domain from being pushed into a mapped one.

    Args:
        extra: Names that must be included (the mapped domains).
        config_dirs: Where domain configs are looked up; ``None``: the shipped ``conf/`` and
            the running command's ``--config-dir`` folders.
    """
    from tss_opt.config.search_path import domain_config_dirs
    from tss_opt.evaluation.domains import (
        DomainError,
        available_domains,
        load_domain,
        read_domain_config,
    )

    dirs = list(config_dirs) if config_dirs is not None else domain_config_dirs()
    names = sorted(set(available_domains(dirs)) | set(extra))
    out = []
    for name in names:
        try:
            out.append(load_domain(read_domain_config(name, dirs)))
        except DomainError as e:
            log.warning("router: domain %r left out (%s)", name, e)
    return out


def load_or_fit_router(
    target: TargetModel, tokenizer: Any, model_id: str, path: Path, extra_domains: Iterable[str] = ()
) -> DomainRouter:
    """The cached router at ``path`` if it matches the model and the domains' prompts, else a
    new one fitted on the domains' calibration prompts (one dense forward each) and saved.

    Args:
        target: The loaded target (the router reads its hidden states).
        tokenizer: Its tokenizer (formats the calibration prompts).
        model_id: The model's id (:attr:`LoadedModel.model_id`): a cached router fitted on
            another model is refitted.
        path: The cache file (:func:`router_cache_path`).
        extra_domains: Domains that must be included (the mapped ones).
    """
    domains = router_domains(extra_domains)
    if not domains:
        raise RouterError("no domain configs found to fit the router on; add conf/domain/*.yaml or pass request_domain=...")
    if path.is_file():
        try:
            router = DomainRouter.load(path, target, model_id=model_id)
            if router.fingerprint == domains_fingerprint(domains, "calibration", BACKGROUND_PROMPTS):
                log.info("router: loaded %s (%s)", path, ", ".join(router.domains))
                return router
            log.info("router: %s was fitted on other prompts; refitting", path)
        except RouterError as e:
            log.warning("router: %s; refitting", e)
    log.info("router: fitting on the calibration prompts of %s", ", ".join(d.name for d in domains))
    router = DomainRouter.fit_domains(target, tokenizer, domains, model_id=model_id)
    router.save(path)
    log.info("router: saved %s", path)
    return router
