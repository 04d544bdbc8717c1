"""vLLM's Llama with per-token layer skipping: ``TssLlamaForCausalLM``.

vLLM's Llama decoder layer defers its residual add into the next layer's fused add+RMSNorm: a
layer takes ``(h, r)`` and returns ``(mlp_out, x + attn_out)``, the block's output being their
sum (``model_executor/models/llama.py``). So a skipped layer returns ``(h, r)`` unchanged, and
the next layer's fused add sees exactly what it sees in a checkpoint without that layer (the
residual is ``None`` only before layer 0, whose skip returns ``(h, None)``). The model class is
vLLM's own, built with a decoder-layer subclass through the ``layer_type`` argument vLLM's
``LlamaForCausalLM`` takes; weights, attention and the cache are untouched.

Each layer reads the step's plan (``plan.py``), set by the runner hook (``adapter.py``) around
the forward of a step:

- no plan (no request skips anything), or a dense layer: vLLM's own forward, unchanged;
- every token skips the layer: ``(h, r)`` returned, no attention, no KV write, no MLP;
- mixed: input norm and attention on every token (the layers share one attention metadata;
  the keys and values a skipping token writes at this layer are never read into its output:
  its request never runs this layer's attention at a later position), then the
  post-attention norm and MLP on the kept tokens only, scattered back, and the skipping
  tokens' ``(h, r)`` restored (layer 0: ``(0, h)``, whose fused add gives ``h`` exactly). The
  skipping tokens' inputs are copied first: vLLM's fused norm works in place on a GPU.

The plan is Python control flow around each layer, which vLLM's compiled graph would trace
once (dense) and replay for every later step: the model refuses to load unless compilation is
off (``enforce_eager=True``; on a GPU this also rules out CUDA graphs), with a clear error.
"""

from __future__ import annotations

import os

import torch
from vllm.config import CompilationMode, VllmConfig
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index

import tss_opt.runtime.vllm_plugin.adapter as adapter
from tss_opt.runtime.vllm_plugin.mapping_env import check_mapping_for_model
from tss_opt.runtime.vllm_plugin.names import ARCHITECTURE
from tss_opt.runtime.vllm_plugin.plan import LayerKind, current_plan

__all__ = ["TSSModelError", "TssLlamaDecoderLayer", "TssLlamaForCausalLM"]

class TSSModelError(RuntimeError):
    """The TSS model cannot run under this vLLM configuration."""


class TssLlamaDecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama decoder layer, run, skipped or run on some tokens as the step plan says."""

    def __init__(self, vllm_config: VllmConfig, prefix: str = "", **kwargs) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self.layer_index = extract_layer_index(prefix)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden_states``, ``residual``: ``(num_tokens, hidden)`` (``residual`` ``None``
        before layer 0); returns the pair the next layer's fused add takes."""
        plan = current_plan()
        kind = LayerKind.dense if plan is None else plan.kinds[self.layer_index]
        if kind is LayerKind.dense:
            return super().forward(positions, hidden_states, residual)
        if kind is LayerKind.skip:
            return hidden_states, residual
        kept = plan.kept[self.layer_index]  # type: ignore[union-attr]
        # The skipping tokens' outputs are their inputs: taken before the (maybe in-place) norm.
        h_out = hidden_states.clone()
        r_out = hidden_states.clone() if residual is None else residual.clone()
        if residual is None:
            h_out.zero_()  # layer 0: (0, h) makes the next fused add give h exactly
            residual = hidden_states
            x = self.input_layernorm(hidden_states)
        else:
            x, residual = self.input_layernorm(hidden_states, residual)
        x = self.self_attn(positions=positions, hidden_states=x)
        # x, residual: [T, hidden]; the MLP runs on the kept tokens only: [n_kept, hidden].
        x_kept, r_kept = self.post_attention_layernorm(x.index_select(0, kept), residual.index_select(0, kept))
        h_out.index_copy_(0, kept, self.mlp(x_kept))
        r_out.index_copy_(0, kept, r_kept)
        return h_out, r_out


class TssLlamaForCausalLM(LlamaForCausalLM):
    """vLLM's ``LlamaForCausalLM`` whose decoder layers follow the step plan."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        mode = vllm_config.compilation_config.mode
        if mode != CompilationMode.NONE:
            raise TSSModelError(
                f"{ARCHITECTURE} needs vLLM's compilation off (compilation mode is {mode.name}): a compiled "
                "graph is traced once, dense, and would run every later step dense. Start vLLM with "
                "--enforce-eager (LLM(..., enforce_eager=True)); `python -m tss_opt.cli.serve backend=vllm` "
                "does this for you"
            )
        if vllm_config.use_v2_model_runner:
            raise TSSModelError(
                f"{ARCHITECTURE} hooks vLLM's V1 model runner, but this engine uses the V2 runner; "
                "start it with VLLM_USE_V2_MODEL_RUNNER=0"
            )
        if (why := adapter.installed()) is not None:
            raise TSSModelError(f"{ARCHITECTURE} cannot run: {why}")
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=TssLlamaDecoderLayer)
        self.tss_num_layers = int(vllm_config.model_config.hf_config.num_hidden_layers)
        check_mapping_for_model(self.tss_num_layers, os.environ)
