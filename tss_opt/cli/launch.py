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

    A ``cuda:N`` device becomes ``device=cuda:0``: the worker sees only its own GPU (see
    :func:`worker_env`), which is then its first. ``storage=`` is dropped too: the workers get
    the URL through ``$TSS_STORAGE``, so its password is on no command line.
    """
    drop = ("devices", "device", "storage")
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in drop]
    dirs = list(config_dirs or [])
    return [[sys.executable, "-m", "tss_opt", *dirs, *keep, f"device={worker_device(d)}"] for d in devices]


def _cuda_index(device: str) -> int | None:
    """``N`` of ``cuda:N``; ``None`` for any other device (``cpu``, ``cuda``, ``mps``)."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index:
        return None
    if not index.isdigit():
        raise UsageError(f"device {device!r} is not a device; expected cuda:N (e.g. cuda:0) or cpu")
    return int(index)


def worker_device(device: str) -> str:
    """The device a worker is told: ``cuda:0`` for ``cuda:N`` (its only visible GPU)."""
    return "cuda:0" if _cuda_index(device) is not None else device


def worker_env(storage: str | None, device: str | None = None) -> dict[str, str]:
    """A worker's environment: this one, with ``TSS_STORAGE`` set to the resolved URL and, for
    a ``cuda:N`` device, ``CUDA_VISIBLE_DEVICES`` naming that one GPU.

    One GPU per worker: the worker cannot touch another worker's GPU (no CUDA context, no
    stray allocation on GPU 0). An index counts among the GPUs this launcher sees: with
    ``CUDA_VISIBLE_DEVICES=2,3`` already set, ``cuda:1`` is GPU 3.
    """
    env = dict(os.environ)
    env[STORAGE_ENV_VAR] = resolve_storage_url(storage)
    index = _cuda_index(device) if device is not None else None
    if index is not None:
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if visible and index >= len(visible):
            raise UsageError(
                f"device cuda:{index} is not visible: CUDA_VISIBLE_DEVICES={','.join(visible)} leaves "
                f"{len(visible)} GPU(s) (cuda:0..cuda:{len(visible) - 1}); list devices among those"
            )
        env["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)
    return env


def launch(cfg: DictConfig) -> int:
    devices = list(cfg.get("devices") or [])
    if not devices:
        raise UsageError("no devices listed; add devices=[cuda:0,cuda:1] (or devices=[cpu,cpu])")
    cmds = worker_commands(list(HydraConfig.get().overrides.task), devices, config_dir_args())
    procs = []
    for cmd, device in zip(cmds, devices):
        env = worker_env(cfg.get("storage"), device)
        shown = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} " if _cuda_index(device) is not None else ""
        log.info("starting worker: %s%s", shown, mask_secrets(" ".join(cmd[1:])))
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
