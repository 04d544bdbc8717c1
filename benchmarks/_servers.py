"""The two servers ``serve_load.py`` compares, each started as its own process on a free
loopback port: ours (``python -m tss_opt.cli.serve``) and the peer (``transformers serve DIR
--continuous-batching``), on the same float32 checkpoint and the same CPU thread count.

Not a package module: ``serve_load.py`` imports it as ``_servers`` (``python
benchmarks/serve_load.py`` puts ``benchmarks/`` first on ``sys.path``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]

PEER_PIP = 'pip install "transformers[serving]"'


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server.

    Attributes:
        name: ``ours`` or ``peer`` (the table's server column).
        port: The loopback port it listens on.
        argv: The command line, the interpreter first.
        env: Variables set on top of this process's environment.
        model: The id requests must name (the peer is pinned to its checkpoint directory);
            ``None``: the first id the server's ``/v1/models`` lists.
        log: Where the server's stdout and stderr go.
    """

    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    model: str | None
    log: Path

    @property
    def shown(self) -> str:
        """The command as a person would type it (``python -m ...`` / ``transformers serve``)."""
        argv = list(self.argv)
        if argv[1:3] == ["-m", "transformers.cli.transformers"]:
            argv = ["transformers", *argv[3:]]
        elif argv[0] == sys.executable:
            argv[0] = "python"
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()) if k != "PYTHONPATH")
        return f"{env} {' '.join(argv)}".strip()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def thread_env(threads: int) -> dict[str, str]:
    """Both servers get the same intra-op thread count: torch reads OMP_NUM_THREADS at start."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def checkpoint_dir(cache_dir: Path) -> Path:
    """The embedded model as a Hugging Face checkpoint (config, safetensors, tokenizer).

    tss_opt converts the packaged GGUF once into ``<cache_dir>/<model name>`` (float32
    safetensors, tss_opt/models/loading.py); our server then loads that directory, and the peer
    is pointed at the same one, so both serve the very same weights. Converts when missing
    (about 30 s).
    """
    from tss_opt.assembly import compose_config

    cfg = compose_config([f"model.cache_dir={cache_dir}"])
    path = cache_dir / str(cfg.model.name)
    if not (path / "model.safetensors").is_file():
        from tss_opt.models.loading import load_model

        print(f"converting the embedded model once into {path} (about 30 s)", flush=True)
        del load_model(cfg.model).model  # the conversion is the side effect wanted
    return path


def peer_missing() -> str | None:
    """Why ``transformers serve`` cannot run here, naming the pip command; ``None`` if it can."""
    try:
        from transformers.utils.import_utils import is_serve_available
    except ImportError:
        return f"transformers is not installed; install the peer's server with: {PEER_PIP}"
    if not is_serve_available():
        return (
            "`transformers serve` needs its serving extras (fastapi, uvicorn, pydantic, openai); "
            f"install them with: {PEER_PIP}"
        )
    return None


def ours_spec(
    port: int, mapping: Path, cache_dir: Path, max_tokens: int, threads: int, extra: Sequence[str], log: Path
) -> ServerSpec:
    """``python -m tss_opt.cli.serve`` of this repository (PYTHONPATH: not an installed copy)."""
    argv = [
        sys.executable, "-m", "tss_opt.cli.serve", "host=127.0.0.1", f"port={port}",
        f"mapping_path={mapping}", f"model.cache_dir={cache_dir}", f"max_new_tokens={max_tokens}",
        f"threads={threads}", *extra,
    ]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return ServerSpec("ours", port, argv, {**thread_env(threads), "PYTHONPATH": path}, None, log)


def peer_spec(port: int, checkpoint: Path, threads: int, extra: Sequence[str], log: Path) -> ServerSpec:
    """``transformers serve DIR --continuous-batching`` in float32 on the CPU, pinned to DIR."""
    argv = [
        sys.executable, "-m", "transformers.cli.transformers", "serve", str(checkpoint),
        "--continuous-batching", "--device", "cpu", "--dtype", "float32",
        "--host", "127.0.0.1", "--port", str(port), *extra,
    ]
    # A local directory: no hub look-ups, no update check at start.
    env = {**thread_env(threads), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    return ServerSpec("peer", port, argv, env, str(checkpoint), log)


def _log_tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def running(spec: ServerSpec, ready_timeout: float = 900.0) -> Iterator[str]:
    """Start ``spec``, wait until ``GET /health`` answers 200, yield its base URL, stop it.

    Raises:
        RuntimeError: The server exited or was not ready within ``ready_timeout`` seconds
            (the message carries the tail of its log).
    """
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{spec.port}"
    with spec.log.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            spec.argv, cwd=REPO, env={**os.environ, **spec.env}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            t0 = time.monotonic()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{spec.name} server exited with status {proc.returncode} before it was ready; "
                        f"its log {spec.log} ends with:\n{_log_tail(spec.log)}"
                    )
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() - t0 > ready_timeout:
                    raise RuntimeError(
                        f"{spec.name} server not ready after {ready_timeout:.0f} s; its log {spec.log} "
                        f"ends with:\n{_log_tail(spec.log)}"
                    )
                time.sleep(1.0)
            yield url
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # uvicorn's graceful stop
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
