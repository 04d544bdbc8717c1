"""The configuration folders a command sees: the shipped ``conf/`` plus the user's
``--config-dir`` folders, so that a domain added as YAML in a user folder works in every
command (search, evaluate, export, launch, report, serve), not only in the one Hydra composed.
"""

from __future__ import annotations

from pathlib import Path

from tss_opt.config.paths import config_dir

__all__ = ["config_dir_args", "domain_config_dirs", "user_config_dirs"]


def _hydra_file_sources() -> list[tuple[str, Path]]:
    """``(provider, folder)`` of Hydra's file config sources in search order; empty outside
    a Hydra app (tests calling commands directly, scripts)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    out = []
    for source in HydraConfig.get().runtime.config_sources:
        if source.schema == "file" and source.path:
            out.append((str(source.provider), Path(source.path).expanduser().resolve()))
    return out


def user_config_dirs() -> list[Path]:
    """The folders given with ``--config-dir`` to the running Hydra app (absolute)."""
    return [path for provider, path in _hydra_file_sources() if provider == "command-line"]


def domain_config_dirs() -> list[Path]:
    """Where ``domain/<name>.yaml`` is looked up, in Hydra's search order: the shipped
    ``conf/`` first (as Hydra composes ``+domain=NAME``), then every ``--config-dir``."""
    dirs = [config_dir().resolve()]
    for path in user_config_dirs():
        if path not in dirs:
            dirs.append(path)
    return dirs


def config_dir_args() -> list[str]:
    """``["--config-dir", DIR, ...]``: what a child process needs to see the same folders."""
    out: list[str] = []
    for path in user_config_dirs():
        out += ["--config-dir", str(path)]
    return out
