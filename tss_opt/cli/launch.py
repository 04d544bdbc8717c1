"""``python -m tss_opt.cli.launch +domain=qa devices=[cuda:0,cuda:1]``: one local search
worker per listed device, all in the same study; exits when every worker has exited."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tss_opt.cli.common import hydra_entry
from tss_opt.config.search_path import config_dir_args
from tss_opt.errors import UsageError

log = logging.getLogger("tss_opt.cli")


def worker_commands(overrides: list[str], devices: list[str], config_dirs: list[str] | None = None) -> list[list[str]]:
    """``python -m tss_opt [--config-dir DIR ...] <overrides> device=<d>`` for every device
    (``devices=`` dropped). ``config_dirs``: the ``--config-dir`` arguments the launcher got,
    passed on so that workers find the same user domains."""
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("devices", "device")]
    dirs = list(config_dirs or [])
    return [[sys.executable, "-m", "tss_opt", *dirs, *keep, f"device={d}"] for d in devices]


def launch(cfg: DictConfig) -> int:
    devices = list(cfg.get("devices") or [])
    if not devices:
        raise UsageError("no devices listed; add devices=[cuda:0,cuda:1] (or devices=[cpu,cpu])")
    cmds = worker_commands(list(HydraConfig.get().overrides.task), devices, config_dir_args())
    procs = []
    for cmd in cmds:
        log.info("starting worker: %s", " ".join(cmd[1:]))
        procs.append(subprocess.Popen(cmd))
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
