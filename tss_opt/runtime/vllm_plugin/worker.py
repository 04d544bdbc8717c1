"""Methods vLLM adds to its workers (``worker_extension_cls``), called through
``collective_rpc``: the per-layer counts of what the skip sets saved."""

from __future__ import annotations

from typing import Any

import tss_opt.runtime.vllm_plugin.adapter as adapter

__all__ = ["TSSWorkerExtension"]


class TSSWorkerExtension:
    """Mixed into vLLM's worker class by ``worker_extension_cls``."""

    def tss_layer_counts(self) -> dict[str, Any] | None:
        """Per layer: steps run dense, skipped and mixed, and tokens whose MLP was skipped
        (:class:`~tss_opt.runtime.vllm_plugin.plan.LayerCounts`; ``None`` before a step)."""
        return adapter.layer_counts()

    def tss_reset_counts(self) -> None:
        adapter.reset_counts()
