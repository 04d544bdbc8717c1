"""The architecture name of the plugin's model (no class paths here: ``registration.py``)."""

from __future__ import annotations

__all__ = ["ARCHITECTURE"]

# A model is served with TSS only when vLLM is told to build this architecture
# (hf_overrides={"architectures": [ARCHITECTURE]}), so plain vLLM in the same environment
# stays plain.
ARCHITECTURE = "TssLlamaForCausalLM"
