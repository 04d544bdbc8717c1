"""TSS inside vLLM: each request on its own skip set, in vLLM's own engine.

A vLLM plugin (``vllm.general_plugins`` entry point ``tss`` -> :func:`register`, run by vLLM in
every process it starts) that registers ``TssLlamaForCausalLM`` (vLLM's Llama whose decoder
layers follow a per-step skip plan, ``model.py``) and installs three hooks on vLLM's internals
(``adapter.py``: the runner builds the step's plan, the front end checks and resolves each
request's TSS fields, the engine core keeps prefix-cache blocks of different skip sets apart).

Use it through ``python -m tss_opt.cli.serve backend=vllm mapping_path=PATH`` (vLLM's OpenAI
server with the plugin, ``launch.py``), or offline::

    import os
    from vllm import LLM, SamplingParams
    from tss_opt.runtime.vllm_plugin import llm_kwargs

    if __name__ == "__main__":  # vLLM spawns its workers
        llm = LLM(model="storage/models/smollm2_135m", **llm_kwargs("storage/mapping.yaml"))
        out = llm.generate(["Summarize: ..."], SamplingParams(temperature=0, max_tokens=64,
                                                              extra_args={"tss_domain": "summarization"}))

See docs/serving.md ("Serving with vLLM").
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tss_opt.runtime.vllm_plugin.names import ARCHITECTURE, MODEL_CLASS, WORKER_EXTENSION

__all__ = ["ARCHITECTURE", "llm_kwargs", "register"]

log = logging.getLogger(__name__)


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
