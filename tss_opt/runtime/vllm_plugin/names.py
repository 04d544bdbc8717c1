"""Names vLLM is told about: the plugin's model architecture and the classes it loads by path."""

from __future__ import annotations

__all__ = ["ARCHITECTURE", "MIDDLEWARE", "MODEL_CLASS", "WORKER_EXTENSION"]

# The architecture the plugin registers; a model is served with TSS only when vLLM is told
# to build it (hf_overrides={"architectures": [ARCHITECTURE]}), so plain vLLM stays plain.
ARCHITECTURE = "TssLlamaForCausalLM"
MODEL_CLASS = "tss_opt.runtime.vllm_plugin.model:TssLlamaForCausalLM"
WORKER_EXTENSION = "tss_opt.runtime.vllm_plugin.worker.TSSWorkerExtension"
MIDDLEWARE = "tss_opt.runtime.vllm_plugin.middleware.TSSMiddleware"
