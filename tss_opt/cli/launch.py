"""``python -m tss_opt.cli.launch +domain=qa devices=[cuda:0,cuda:1]``: one local search
worker per listed device, all in the same study; exits when every worker has exited."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tss_opt.cli.common import hydra_entry
from tss_opt.config.search_path import config_dir_args
from tss_opt.errors import UsageError
from tss_opt.storage.url import STORAGE_ENV_VAR, mask_secrets, resolve_storage_url

log = logging.getLogger("tss_opt.cli")


def worker_commands(overrides: list[str], devices: list[str], config_dirs: list[str] | None = None) -> list[list[str]]:
    """``python -m tss_opt [--config-dir DIR ...] <overrides> device=<d>`` for every device
    (``devices=`` dropped). ``config_dirs``: the ``--config-dir`` arguments the launcher got,
    passed on so that workers find the same user domains.

    ``storage=`` is dropped too: the workers get the URL through ``$TSS_STORAGE`` (see
    :func:`worker_env`), so its password is on no command line.
    """
    drop = ("devices", "device", "storage")
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in drop]
    dirs = list(config_dirs or [])
    return [[sys.executable, "-m", "tss_opt", *dirs, *keep, f"device={d}"] for d in devices]


def worker_env(storage: str | None) -> dict[str, str]:
    """The workers' environment: this one, with ``TSS_STORAGE`` set to the resolved URL."""
    env = dict(os.environ)
    env[STORAGE_ENV_VAR] = resolve_storage_url(storage)
    return env


def launch(cfg: DictConfig) -> int:
    devices = list(cfg.get("devices") or [])
    if not devices:
        raise UsageError("no devices listed; add devices=[cuda:0,cuda:1] (or devices=[cpu,cpu])")
    cmds = worker_commands(list(HydraConfig.get().overrides.task), devices, config_dir_args())
    env = worker_env(cfg.get("storage"))
    procs = []
    for cmd in cmds:
        log.info("starting worker: %s", mask_secrets(" ".join(cmd[1:])))
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:  # forward Ctrl-C; the study resumes when re-launched
        for p in procs:
            p.send_signal(signal.SIGINT)
        codes = [p.wait() for p in procs]
    bad = [(d, c) for d, c in zip(devices, codes) if c != 0]
    if bad:
        raise SystemExit(f"workers failed: {bad}")
    print(f"{len(procs)} workers finished")
    return 0


main = hydra_entry(launch)

if __name__ == "__main__":
    main()
