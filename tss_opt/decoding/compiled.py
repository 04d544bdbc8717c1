"""A compiled verification step: a preallocated KV cache and one ``torch.compile``d decoder layer.

On a GPU, eager PyTorch spends most of a small step launching kernels from Python (a 13B
bfloat16 step on an H200 reads its 26 GB in about 5.4 ms, while eager decoding launches ~600
kernels; gpt-fast gets about 2x with a static cache and ``torch.compile``). Here the layer's
forward is compiled **once** and every layer runs through the same graph (dynamo's
``inline_inbuilt_nn_modules`` makes the weights graph inputs, so one graph serves every layer
instance); the skip loop stays in Python outside the graph, so a change of skip set never
recompiles. Shapes repeat so the graphs are reused:

* the verified slots (root plus tree) are padded to a bucket of :data:`BUCKETS`; pad slots
  write their keys/values behind the real ones, where the next step overwrites them and no
  mask ever lets a real slot read them;
* the cache's layers become in-place layers (preallocated buffers,
  :func:`~tss_opt.decoding.cache.preallocate`, at a request's first step: the prefill and
  the prefill store keep the compact cache they had), and attention reads a window of the
  buffer rounded up to :data:`KEY_BLOCK` positions, marked dynamic (one graph for every
  cached length); the additive 4-D mask hides the unwritten slots of the window.

On a CPU a plain step (one slot) also runs the final norm and the output head as a second
graph (:func:`_head_step`: the head's one-row product fused into one streaming reduction).
A bfloat16 target on a CPU runs the products of steps of 2-16 slots inside the graph on its
prepacked weights (``decoding/linear.py``: the same kernel as the eager step without oneDNN's
per-call weight reorder; 1.1-1.2x faster steps of 2-16 slots on SmolLM2 on the Xeon).
Attention in half precision is :func:`~tss_opt.decoding.attention.attend`, traced into the graph.
Each graph call keeps only the guards on its tensors and the interpreter's state
(:func:`tensor_guards`): the others check Python objects that cannot change while a target
lives, and dynamo evaluated them 31 times a step. Once a bucket's graph has served two layers
through dynamo, the step calls it directly (:class:`~tss_opt.decoding.direct.DirectCompiled`:
the same graph on the same inputs, without dynamo's ~70 us a call; checked, not assumed).
The prefill and trees larger than the largest bucket run eagerly (the parent's forward).
The batch engine (``decoding/batch.py``, ``ragged.py``; the replay evaluator generates with it)
calls the model itself and stays eager on a compiled target; :meth:`CompiledTarget.verify_forward`
refuses per-row skip sets (``apply_ragged``) rather than mixing them up.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config

from tss_opt.decoding.attention import verify_attention
from tss_opt.decoding.cache import InPlaceLayer, SkipAwareCache, preallocate, with_cache
from tss_opt.decoding.direct import DirectCompiled
from tss_opt.decoding.host_syncs import upload
from tss_opt.decoding.linear import packed_linears
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.errors import TSSError

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""Verified-slot counts a step is padded to (one graph each; within dynamo's default limit
of 8 graphs per compiled function)."""

KEY_BLOCK = 128
"""The attention window (cached positions read) is rounded up to a multiple of this."""

WINDOW_SIZES = frozenset({"L['mask'].size()[3]", "L['keys'].size()[2]", "L['values'].size()[2]"})
"""The sizes of a layer graph's inputs that change under one bucket (the attention window and
the cache buffers' length, marked dynamic): a bucket's graph is called directly only where
they are its inputs (:class:`~tss_opt.decoding.direct.DirectCompiled`)."""

ROOM = 512
"""Positions preallocated past the prefix when a cache is made static (the buffers double
when a request outgrows them, :class:`~tss_opt.decoding.cache.InPlaceLayer`)."""


STATE_GUARDS: frozenset[str] = frozenset({
    "GRAD_MODE", "GLOBAL_STATE", "DETERMINISTIC_ALGORITHMS", "TORCH_FUNCTION_STATE", "DEFAULT_DEVICE",
    "AUTOGRAD_SAVED_TENSORS_HOOKS", "SHAPE_ENV",
})
"""Dynamo's guards on the interpreter's state (grad and inference mode, the default device,
the symbolic shapes' constraints) that :func:`tensor_guards` keeps beside the tensors'."""


def tensor_guards(entries: list[Any]) -> list[bool]:
    """Which of dynamo's guards a graph of a compiled target keeps (a ``guard_filter_fn``).

    Kept: every tensor's (shape, strides, dtype, device: they pick the bucket's graph), the
    interpreter's state (:data:`STATE_GUARDS`) and any guard on a ``layer_idx`` (a decoder that
    branched on it would recompile per layer, as with dynamo's own guards, and hit the graph
    limit loudly rather than run another layer's graph). Dropped: the checks on Python objects
    (module attributes and hooks, globals, closures: 342 of SmolLM2's 372 guards per layer
    graph), which dynamo evaluates on each of a step's 31 graph calls although they hold by
    construction here: a target's modules do not change after it is built, and its layers
    were checked to be alike (:func:`layers_alike`). One plain bfloat16 step on the EPYC
    of docs/engine.md "Guards": 1.05-1.11x faster.
    """
    return [e.guard_type == "TENSOR_MATCH" or e.guard_type in STATE_GUARDS or e.name.endswith("layer_idx") for e in entries]


def _layout(layer: torch.nn.Module) -> tuple[Any, ...]:
    """Everything about a decoder layer that its graph can read besides its tensors: each
    module's path, class and non-tensor attributes (hooks included), ``layer_idx`` left out."""
    out = []
    for path, module in layer.named_modules():
        attrs = sorted(
            (k, repr(v)) for k, v in vars(module).items()
            if k not in ("_parameters", "_buffers", "_modules", "forward", "layer_idx")  # forward: the skip patch
            and not isinstance(v, (torch.Tensor, torch.nn.Module))
        )
        out.append((path, type(module), tuple(attrs)))
    return tuple(out)


def layers_alike(layers: Any) -> bool:
    """Whether every decoder layer has the same :func:`_layout`: then one graph serves them all
    with :func:`tensor_guards`; otherwise (a model whose layers differ, say, by a sliding
    window) the graphs keep dynamo's every guard, which recompiles per kind of layer."""
    return len({_layout(layer) for layer in layers}) <= 1


class CompileError(TSSError):
    """A compiled target used where it cannot run (a batch of rows, a non-Llama-style decoder)."""


class _WindowCache:
    """What a decoder layer's attention sees as its cache inside the compiled graph: one
    layer's key/value buffers; ``update`` writes the step's slots at ``slots`` in place and
    returns the first ``width`` positions (unwritten ones are masked)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, width: int) -> None:
        self.keys, self.values, self.slots, self.width = keys, values, slots, width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # The layer index is ignored: reading it would make the graph specialize per layer.
        # The whole buffers are graph inputs, mutated in place (a mutated *view* input makes
        # the graph copy the whole view back every call).
        self.keys.index_copy_(2, self.slots, key_states)
        self.values.index_copy_(2, self.slots, value_states)
        return self.keys[:, :, : self.width], self.values[:, :, : self.width]


def _layer_step(
    layer: torch.nn.Module,
    hidden: torch.Tensor,
    mask: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One decoder layer over a padded step (the function that is compiled).

    Args:
        hidden: ``(1, B, hidden)``, ``B`` a bucket.
        mask: additive ``(1, 1, B, W)``.
        cos, sin: the rotary embeddings of the slots, ``(1, B, head_dim)``.
        positions: ``torch.LongTensor`` of shape ``(1, B)``.
        keys, values: ``(1, H_kv, C, head_dim)``, ``C >= W``: the layer's cache buffers,
            written in place at ``slots`` (``torch.LongTensor`` of shape ``(B,)``); attention
            reads their first ``W`` positions.

    Returns:
        ``(1, B, hidden)``.
    """
    cache = _WindowCache(keys, values, slots, mask.shape[-1])
    # The class's forward, not ``layer.forward``: the skip controller patches the instance
    # attribute, and skipping is decided outside the graph.
    return type(layer).forward(
        layer, hidden, attention_mask=mask, position_ids=positions, **with_cache(cache), use_cache=True,
        position_embeddings=(cos, sin),
    )


def _head_step(norm: torch.nn.Module, head: torch.nn.Linear, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The final norm and the output head over one position (the function compiled for a
    plain step on a CPU). The head's one-row product is the step's largest (21 % of SmolLM2's
    weights) and ``aten::mm`` reads it at about half a sum's rate (one thread, bfloat16:
    3.7 ms against the 2 ms its 57 MB take); written as a multiply-and-sum, inductor fuses it
    into one reduction kernel that streams the weights (what ``decompose_mm_pass`` does for
    the layers' products, which it leaves alone above 2048 outputs).

    Args:
        hidden: ``(1, 1, hidden)``.

    Returns:
        ``(logits, normed)`` of shapes ``(1, 1, vocab)`` and ``(1, 1, hidden)``.
    """
    normed = norm(hidden)
    logits = (head.weight * normed[:, :, None, :]).sum(-1)  # [1, 1, V]: accumulated in float32
    if head.bias is not None:
        logits = logits + head.bias
    return logits, normed


class CompiledTarget(TargetModel):
    """A :class:`TargetModel` whose verification forwards run one compiled decoder layer.

    Greedy output equals the eager target's (same math; the compiled kernels only round
    differently, far below the argmax margins of the tests' float64 model).

    Args:
        model, layers_path, max_context: as :class:`TargetModel`.
        backend: a ``torch.compile`` backend, by name or as a callable (``"eager"`` runs the
            captured graph as is: bit-identical to the eager step, for debugging).
        lean_guards: keep only :func:`tensor_guards` where the layers are alike (``False``:
            dynamo's every guard, the benchmarks' side-by-side arm).
        direct: with lean guards, call each bucket's graphs directly once dynamo has served
            them (:class:`~tss_opt.decoding.direct.DirectCompiled`; ``False``: every call
            through dynamo's frame, the benchmarks' side-by-side arm).

    Attributes:
        compilations: graphs compiled so far (each call of the backend), for tests and
            benchmarks: a change of skip set must not add any.
        lean_guards: whether the layer graphs keep only :func:`tensor_guards` (the layers are
            alike); hooks registered on the layers after the target is built are then not seen.
        direct: whether checked graphs are called past dynamo's frame (lean guards and
            ``direct=True``).
    """

    compiled = True
    slot_buckets = BUCKETS

    def __init__(
        self,
        model: Any,
        layers_path: str = "model.layers",
        max_context: int | None = None,
        backend: str | Callable[..., Any] = "inductor",
        lean_guards: bool = True,
        direct: bool = True,
    ) -> None:
        super().__init__(model, layers_path, max_context)
        missing = [n for n in ("embed_tokens", "rotary_emb", "norm") if not hasattr(self.decoder, n)]
        if missing:
            raise CompileError(
                f"compile=true needs a Llama-style decoder (embed_tokens, rotary_emb, norm); "
                f"{type(self.decoder).__name__} lacks {', '.join(missing)}. Set compile=false."
            )
        self.layers = self.skipper.layers
        self.compilations = 0
        # Each graph passes through ``counting`` once, when it is compiled (the count tests and
        # benchmarks read); dynamo's own counters are private and global.
        inner = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend
        # On a CPU the one-row matrix products of a plain step read the weights at ~60 % of a
        # sum's rate through aten::mm (one thread; measured in the docs, engine.md "Compiled
        # step"); inductor's decompose_mm_pass turns a product with one row into a fused
        # multiply-and-reduce kernel that reads them at ~90 % (a plain step 1.25-1.43x faster
        # than eager). Only on a CPU: a GPU's matrix kernels already stream the weights.
        # size_asserts: the generated code's own checks of its inputs' sizes and strides, which
        # the tensor guards kept by ``tensor_guards`` make twice-checked (16 a layer call).
        options: dict[str, Any] = {"size_asserts": False}
        if self.device.type == "cpu":
            options["post_grad_fusion_options"] = {"decompose_mm_pass": {}}

        def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
            self.compilations += 1
            with torch._inductor.config.patch(options):
                return inner(gm, example_inputs)

        # A fresh code object per target: dynamo keeps its graphs (and its limit of 8 per
        # function) on the code object, so two targets (float32 and float64 models in one
        # process) would otherwise share, and exhaust, one cache.
        fn = types.FunctionType(_layer_step.__code__.replace(), _layer_step.__globals__, "_layer_step")
        self.lean_guards = lean_guards and layers_alike(self.layers)
        layer_guards = {"guard_filter_fn": tensor_guards} if self.lean_guards else None
        # Direct calls skip dynamo's guards: only where they are the lean ones (the layers alike),
        # whose every check the bucket (the key) and the window's sizes (``varying``) cover.
        self.direct = direct and self.lean_guards
        self._step = DirectCompiled(
            fn, counting, varying=WINDOW_SIZES, enabled=self.direct, fullgraph=True, dynamic=False, options=layer_guards,
        )
        self._head: DirectCompiled | None = None
        if self.device.type == "cpu" and isinstance(self.lm_head, torch.nn.Linear):
            head = types.FunctionType(_head_step.__code__.replace(), _head_step.__globals__, "_head_step")
            head_guards = {"guard_filter_fn": tensor_guards} if lean_guards else None  # one module: alike
            self._head = DirectCompiled(
                head, counting, enabled=self.direct, fullgraph=True, dynamic=False, options=head_guards,
            )

    @torch.inference_mode()
    def verify_forward(
        self, root_token: int, tree: DraftTree, cache: SkipAwareCache, prefix_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`TargetModel.verify_forward`, through the compiled layer.

        Returns:
            ``(logits, hidden)`` of shapes ``(n + 1, vocab)`` and ``(n + 1, hidden)``.
        """
        n1 = len(tree) + 1
        ctr = self.skipper
        if ctr.batched:
            raise CompileError("a compiled target verifies one request at a time; batches of rows run eagerly (compile=false)")
        bucket = next((b for b in BUCKETS if b >= n1), None)
        if bucket is None:
            return super().verify_forward(root_token, tree, cache, prefix_len)
        skip = ctr.active
        window = -(-(prefix_len + bucket) // KEY_BLOCK) * KEY_BLOCK
        preallocate(cache, window + ROOM)
        # ids and positions on the host; pad slots repeat the root (any valid token/position).
        host = torch.empty(3, bucket, dtype=torch.long)
        host[0] = root_token
        if n1 > 1:
            host[0, 1:n1] = tree.tokens
        host[1] = prefix_len
        host[1, :n1] = prefix_len + torch.tensor((0, *tree.depth), dtype=torch.long)
        host[2] = torch.arange(prefix_len, prefix_len + bucket)
        dev = upload(host, self.device)
        ids, pos, slots = dev[0:1], dev[1:2], dev[2]
        mask = self._mask(tree, prefix_len, bucket, window)
        hidden = self.decoder.embed_tokens(ids)  # [1, B, H]
        cos, sin = self.decoder.rotary_emb(hidden, position_ids=pos)
        with verify_attention(self.model):  # traced into the graph: the eager step's attention
            hidden = self._layers(hidden, mask, cos, sin, pos, slots, cache, skip, prefix_len, n1, window)
        if n1 == 1 and self._head is not None:  # a plain step on a CPU: one graph for the norm and the head
            logits, normed = self._head(None, self.decoder.norm, self.lm_head, hidden[:, :1])
            return logits[0], normed[0]
        hidden = self.decoder.norm(hidden)[0, :n1]  # [n+1, H]
        with packed_linears():  # the head runs eagerly here: prepacked where it applies (linear.py)
            return self.lm_head(hidden), hidden

    def _layers(
        self, hidden: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
        slots: torch.Tensor, cache: SkipAwareCache, skip: frozenset[int], prefix_len: int, n1: int, window: int,
    ) -> torch.Tensor:
        """Every running layer through the compiled graph (``(1, B, hidden)`` in and out)."""
        ctr = self.skipper
        bucket = hidden.shape[1]
        through_dynamo = bucket not in self._step.direct  # dynamo reads the dynamic-size hints
        for idx, layer in enumerate(self.layers):
            if idx in skip:
                continue  # bypass: the block's input flows on (skip.py's rule, outside the graph)
            kv = cache.layers[idx]
            assert isinstance(kv, InPlaceLayer) and kv.is_initialized and kv.get_seq_length() == prefix_len, (
                "a running layer holds the whole prefix"
            )
            keys, values = kv.buffers(window)  # [1, H_kv, C, D], C >= W: the preallocated buffers
            if through_dynamo:
                torch._dynamo.maybe_mark_dynamic(keys, 2)  # C doubles when a request outgrows it
                torch._dynamo.maybe_mark_dynamic(values, 2)
                torch._dynamo.maybe_mark_dynamic(mask, 3)
            ctr.executed_layers += 1
            hidden = self._step(bucket, layer, hidden, mask, cos, sin, pos, keys, values, slots)
            kv.set_length(prefix_len + n1)  # the pad slots' keys/values stay outside
        return hidden

    def _mask(self, tree: DraftTree, prefix_len: int, bucket: int, window: int) -> torch.Tensor:
        """Additive ``(1, 1, bucket, window)`` mask: the prefix and each slot's ancestors are
        visible (0), everything else (other branches, pad slots, unwritten positions) is the
        dtype's minimum; a pad row sees the prefix only (its output is discarded)."""
        n1 = len(tree) + 1
        allowed = torch.zeros(bucket, window, dtype=torch.bool)
        allowed[:, :prefix_len] = True
        allowed[:n1, prefix_len : prefix_len + n1] = tree.ancestor_matrix()
        mask = torch.zeros(bucket, window, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return upload(mask, self.device)[None, None]
