"""What vLLM is told about the plugin, and the entry point it calls in every process.

The class paths vLLM loads by name live here, and nothing in the package imports this module:
the entry point (``pyproject.toml``), the launch command and offline scripts read it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tss_opt.runtime.vllm_plugin.names import ARCHITECTURE

__all__ = ["ARCHITECTURE", "MIDDLEWARE", "MODEL_CLASS", "WORKER_EXTENSION", "llm_kwargs", "register"]

log = logging.getLogger(__name__)

MODEL_CLASS = "tss_opt.runtime.vllm_plugin.model:TssLlamaForCausalLM"
WORKER_EXTENSION = "tss_opt.runtime.vllm_plugin.worker.TSSWorkerExtension"
MIDDLEWARE = "tss_opt.runtime.vllm_plugin.middleware.TSSMiddleware"


def register() -> None:
    """vLLM's general-plugin entry point: register the model and install the hooks.

    Runs in every vLLM process, also where nobody asked for TSS, so it never raises: a vLLM
    without an internal the plugin needs leaves plain vLLM working, and the TSS model then
    refuses to load with the reason (``model.py``).
    """
    try:
        from vllm import ModelRegistry

        if ARCHITECTURE not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
        from tss_opt.runtime.vllm_plugin import adapter

        adapter.install()
    except Exception as e:  # noqa: BLE001 - plain vLLM must keep working whatever happened here
        log.warning("the TSS vLLM plugin is not active in this process: %s", e)


def llm_kwargs(mapping_path: str | os.PathLike[str] | None = None, model_id: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` that serve the TSS model (and set the mapping the
    spawned processes read: ``TSS_MAPPING``/``TSS_MODEL_ID`` in ``os.environ``).

    Args:
        mapping_path: The mapping file whose domains ``extra_args={"tss_domain": ...}`` name
            (``None``: explicit ``tss_skip`` sets only; domains run dense).
        model_id: The served model's study identity, to check the mapping against (``None``:
            its layer count only).
    """
    from tss_opt.runtime.vllm_plugin.mapping_env import llm_env

    os.environ.update(llm_env(mapping_path, model_id))
    return {
        "hf_overrides": {"architectures": [ARCHITECTURE]},
        "enforce_eager": True,
        "worker_extension_cls": WORKER_EXTENSION,
    }
