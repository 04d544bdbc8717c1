"""EAGLE-1 draft head: the model, its checkpoint format, and tree drafting.

EAGLE (Li et al. 2024, arXiv 2401.15077) drafts at the feature level. The head sees the
target's final hidden states ("features", after the final norm) of the committed tokens:
pair ``j`` is ``concat(embed(t[j+1]), f[j])``, projected by ``fc`` (``2H -> H``) and run
through one Llama decoder layer; its output predicts the next feature ``f[j+1]``, which the
target's own ``lm_head`` turns into a distribution over ``t[j+2]``. The head reuses the
target's ``embed_tokens`` and ``lm_head`` (references, not copies).

Checkpoint format of ``yuhuili/EAGLE-Vicuna-7B-v1.3`` (SafeAILab/EAGLE ``cnets.py``): a
directory with ``config.json`` (a Llama config with ``num_hidden_layers: 1`` and an optional
``bias`` flag for ``fc``) and ``pytorch_model.bin`` (or ``model.safetensors``) with keys
``fc.weight``, ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight``
and possibly ``embed_tokens.weight``. Layer 0 has no ``input_layernorm`` (its input is the
``fc`` projection); later layers, if any, do.

Drafting follows EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858): expand the
``top_k`` most probable nodes of each level by cumulative log-probability, then keep the
``total_tokens - 1`` best nodes of all levels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from tss_opt.decoding.cache import crop_to
from tss_opt.decoding.drafter import Drafter, VerifyFeedback
from tss_opt.decoding.tree import DraftTree
from tss_opt.errors import TSSError

CONFIG_FILE = "config.json"
WEIGHTS_BIN = "pytorch_model.bin"
WEIGHTS_SAFETENSORS = "model.safetensors"
# Written beside a checkpoint by tss_opt.training (the target it was trained for, its data);
# the loader reads only the target's name from it, to say which model a misfit head is for.
TRAINING_FILE = "training.json"
# Keys an EAGLE-1 checkpoint may carry that the head does not own: it uses the target's.
_TARGET_OWNED = ("embed_tokens.weight",)


class EagleHeadError(TSSError):
    """An EAGLE head checkpoint is missing or does not fit the target model."""


def _causal_lm(target_model: Any) -> Any:
    """Accept a :class:`TargetModel` or a transformers causal LM."""
    if hasattr(target_model, "get_input_embeddings"):
        return target_model
    return target_model.model


class EagleHead(nn.Module):
    """``fc`` over ``concat(embedding, feature)`` plus Llama decoder layer(s).

    Args:
        config: the head's Llama config (``hidden_size`` must equal the target's).
        embed_tokens: the target's input embedding (kept by reference, not registered).
        lm_head: the target's output projection (kept by reference, not registered).
        bias: whether ``fc`` has a bias (EAGLE-1 checkpoints do).
        first_layer_norm: give layer 0 an ``input_layernorm`` (EAGLE-1 has none).
    """

    def __init__(
        self,
        config: LlamaConfig,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        bias: bool = True,
        first_layer_norm: bool = False,
    ) -> None:
        super().__init__()
        if config._attn_implementation is None:
            config._attn_implementation = "sdpa"  # takes the explicit 4-D additive mask as given
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        layers = []
        for i in range(config.num_hidden_layers):
            layer = LlamaDecoderLayer(config, layer_idx=i)
            if i == 0 and not first_layer_norm:
                layer.input_layernorm = nn.Identity()
            layers.append(layer)
        self.layers = nn.ModuleList(layers)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # Plain attributes, not submodules: neither in state_dict nor moved/cast with the head.
        object.__setattr__(self, "_target_modules", (embed_tokens, lm_head))

    @property
    def embed_tokens(self) -> nn.Module:
        return self._target_modules[0]

    @property
    def lm_head(self) -> nn.Module:
        return self._target_modules[1]

    @property
    def has_bias(self) -> bool:
        return self.fc.bias is not None

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Predict next features.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, q)``: token ``t[j+1]`` of pair ``j``.
            features: ``torch.FloatTensor`` of shape ``(1, q, hidden)``: feature ``f[j]``.
            position_ids: ``torch.LongTensor`` of shape ``(1, q)``.
            attention_mask: additive ``(1, 1, q, cached + q)`` mask; ``None`` = causal
                without a cache.
            cache: the head's own KV cache, appended to.

        Returns:
            ``torch.FloatTensor`` of shape ``(1, q, hidden)``: predicted features
            (``lm_head`` of them gives next-token logits).
        """
        emb = self.embed_tokens(input_ids).to(features.dtype)
        h = self.fc(torch.cat([emb, features], dim=-1))  # [1, q, H]
        if attention_mask is None:
            if cache is not None and cache.get_seq_length() > 0:
                raise ValueError(
                    "EagleHead.forward with a non-empty cache needs an explicit attention_mask"
                )
            q = h.shape[1]
            allowed = torch.ones(q, q, dtype=torch.bool, device=h.device).tril()
            attention_mask = additive_mask(allowed, h.dtype)
        pos_emb = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(
                h,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=cache is not None,
                position_embeddings=pos_emb,
            )
        return h


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(q, kv)`` bool -> ``(1, 1, q, kv)`` additive float mask (0 / dtype minimum); a bool
    or 0/1 mask is silently wrong under "eager" attention (FACTS.md)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


# ----------------------------------------------------------------------------- checkpoints
def _head_config_for(target_config: Any) -> LlamaConfig:
    """A one-layer Llama config with the target's shapes (for random heads)."""
    d = target_config.to_dict()
    d.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], model_type="llama")
    return LlamaConfig.from_dict(d)


def random_eagle_head(target_model: Any, seed: int = 0) -> EagleHead:
    """A randomly initialised head with the target's shapes (tests, plumbing checks).

    Args:
        target_model: a :class:`TargetModel` or a transformers causal LM (Llama-like).
        seed: the same seed gives the same weights; the global RNG is left untouched.
    """
    lm = _causal_lm(target_model)
    config = _head_config_for(lm.config)
    p = next(lm.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(config, lm.get_input_embeddings(), lm.get_output_embeddings(), bias=True)
    return head.to(device=p.device, dtype=p.dtype).eval()


def save_eagle_head(
    head: EagleHead, directory: str | Path, include_embeddings: bool = False
) -> Path:
    """Write ``config.json`` + ``pytorch_model.bin`` in the EAGLE-1 format.

    Args:
        include_embeddings: also store ``embed_tokens.weight`` (as some EAGLE-1 checkpoints
            do); the loader checks its shape and otherwise ignores it.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = head.config.to_dict()
    cfg["bias"] = head.has_bias
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2, default=str) + "\n", encoding="utf-8")
    state = {k: v.detach().cpu().clone() for k, v in head.state_dict().items()}
    if include_embeddings:
        state["embed_tokens.weight"] = head.embed_tokens.weight.detach().cpu().clone()
    torch.save(state, out / WEIGHTS_BIN)
    return out


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    bin_path, st_path = directory / WEIGHTS_BIN, directory / WEIGHTS_SAFETENSORS
    if bin_path.is_file():
        try:
            return torch.load(bin_path, map_location="cpu", weights_only=True), bin_path
        except Exception as e:  # a truncated or foreign file: name it
            raise EagleHeadError(f"cannot read EAGLE head weights {bin_path}: {e}") from e
    if st_path.is_file():
        from safetensors.torch import load_file

        return load_file(str(st_path)), st_path
    raise EagleHeadError(
        f"no EAGLE head weights in {directory}: expected {WEIGHTS_BIN} (or {WEIGHTS_SAFETENSORS}) next to {CONFIG_FILE}"
    )


def trained_for(directory: str | Path) -> str | None:
    """The target model a checkpoint was trained for (``training.json``'s ``model``), if any."""
    try:
        meta = json.loads((Path(directory) / TRAINING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = meta.get("model") if isinstance(meta, dict) else None
    return str(model) if model else None


def warn_other_model(directory: str | Path, model_name: str) -> None:
    """Log a warning when a (fitting) checkpoint says it was trained for another model: two
    models may share shapes, and a head trained for one drafts poorly for the other."""
    import logging

    other = trained_for(directory)
    if other is not None and other != model_name:
        logging.getLogger("tss_opt").warning(
            "EAGLE head %s was trained for model %r, not for the target %r; its shapes fit, but "
            "expect a low accepted length (train one with python -m tss_opt.cli.train_drafter)",
            directory, other, model_name,
        )


def load_eagle_head(directory: str | Path, target_model: Any) -> EagleHead:
    """Load an EAGLE-1 head checkpoint for ``target_model``.

    Args:
        directory: holds ``config.json`` and ``pytorch_model.bin`` (or ``model.safetensors``).
        target_model: a :class:`TargetModel` or a transformers causal LM; its embeddings and
            ``lm_head`` are shared with the head, its dtype and device are adopted.

    Raises:
        EagleHeadError: missing directory or files, a config or weight shapes that do not fit
            the target, missing or foreign keys (the message names the file and the shapes).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise EagleHeadError(
            f"EAGLE head directory {directory} not found; set drafter.checkpoint to a local copy of an EAGLE-1 "
            "checkpoint (config.json + pytorch_model.bin; python -m tss_opt.cli.train_drafter writes one), "
            "or drafter.random_init=true for a random head"
        )
    cfg_path = directory / CONFIG_FILE
    if not cfg_path.is_file():
        raise EagleHeadError(
            f"EAGLE head config {cfg_path} not found; an EAGLE-1 checkpoint has {CONFIG_FILE} + {WEIGHTS_BIN}"
        )
    try:
        cfg_dict = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EagleHeadError(f"EAGLE head config {cfg_path} is not valid JSON: {e}") from e
    state, weights_path = _read_weights(directory)

    lm = _causal_lm(target_model)
    embed, lm_head = lm.get_input_embeddings(), lm.get_output_embeddings()
    t_vocab, t_hidden = (int(s) for s in embed.weight.shape)
    config = LlamaConfig.from_dict(cfg_dict)
    if config.hidden_size != t_hidden or config.vocab_size != t_vocab:
        other = trained_for(directory)
        raise EagleHeadError(
            f"{cfg_path}: the head has hidden_size={config.hidden_size}, vocab_size={config.vocab_size} but the "
            f"target has hidden_size={t_hidden}, vocab_size={t_vocab}"
            + (f" (the head was trained for model {other!r})" if other else "")
            + "; use a head trained for this target model (python -m tss_opt.cli.train_drafter)"
        )
    config._attn_implementation = "sdpa"

    if any(k.startswith("midlayer.") for k in state) or "d2t" in state:
        raise EagleHeadError(
            f"{weights_path} looks like an EAGLE-3 head (midlayer.*, d2t); only EAGLE-1/2 heads (fc + layers.*) are supported"
        )
    bias = "fc.bias" in state
    first_norm = "layers.0.input_layernorm.weight" in state
    head = EagleHead(config, embed, lm_head, bias=bias, first_layer_norm=first_norm)
    expected = head.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        raise EagleHeadError(
            f"{weights_path} lacks {len(missing)} head weight(s): {', '.join(missing[:8])}"
        )
    unexpected = [k for k in state if k not in expected and k not in _TARGET_OWNED]
    if unexpected:
        raise EagleHeadError(
            f"{weights_path} has weights an EAGLE-1 head of {config.num_hidden_layers} layer(s) does not own: "
            f"{', '.join(unexpected[:8])}; check config.json's num_hidden_layers"
        )
    bad = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs expected {tuple(v.shape)}"
        for k, v in expected.items()
        if tuple(state[k].shape) != tuple(v.shape)
    ]
    if "embed_tokens.weight" in state and tuple(state["embed_tokens.weight"].shape) != (
        t_vocab,
        t_hidden,
    ):
        bad.append(
            f"embed_tokens.weight: checkpoint {tuple(state['embed_tokens.weight'].shape)} vs target {(t_vocab, t_hidden)}"
        )
    if bad:
        raise EagleHeadError(
            f"{weights_path} does not fit the head built from {cfg_path} for this target: "
            + "; ".join(bad)
        )
    head.load_state_dict({k: state[k] for k in expected}, strict=True)
    p = next(lm.parameters())
    return head.to(device=p.device, dtype=p.dtype).eval()


# ----------------------------------------------------------------------------- drafting
def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax in at least float32 (half-precision scores would reorder close candidates)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


class EagleDrafter(Drafter):
    """Drafts a dynamic tree with an EAGLE head fed the target's features.

    Args:
        head: an :class:`EagleHead` sharing the target's embeddings and ``lm_head``.
        total_tokens: tree budget counting the root, as EAGLE's ``total_token`` (60 gives
            59 draft nodes).
        depth: deepest draft level (EAGLE's ``depth`` + 1: EAGLE-2's depth 5 drafts 6 levels).
        top_k: children per expanded node and nodes expanded per level.
        return_probs: also attach each node's draft distribution (the head's softmax at its
            parent, ``DraftTree.probs`` with ``sampled=False``) for relaxed verification
            (``verification=diversed|cospec`` turns it on); exact verification ignores it.

    Features come from the engine: :meth:`prefill_feedback` gives ``f[0..P-1]`` of the
    prompt, every :meth:`update` the rows of the root and the accepted nodes, i.e. exactly the
    features of every committed token except the newest (the bonus token, not yet run through
    the target). With a skip set they are the sparse target's features, automatically. The
    head keeps a KV cache over the committed pairs; tree slots are cropped after each draft.
    """

    needs_prefill_feedback = True
    gives_confidence = True  # the head's softmax probability of each node given its parent
    gives_distribution = True  # with return_probs: the head's distribution behind every node
    replayable = True  # proposals depend on the context and target features of committed tokens

    def __init__(
        self,
        head: EagleHead,
        total_tokens: int = 60,
        depth: int = 6,
        top_k: int = 8,
        return_probs: bool = False,
    ) -> None:
        if total_tokens < 2 or depth < 1 or top_k < 1:
            raise ValueError(
                f"EAGLE drafting needs total_tokens >= 2, depth >= 1, top_k >= 1; got total_tokens={total_tokens}, "
                f"depth={depth}, top_k={top_k}"
            )
        self.head = head
        self.total_tokens = total_tokens
        self.depth = depth
        self.top_k = top_k
        self.return_probs = return_probs
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._features: torch.Tensor | None = None  # [m, H]: f[0..m-1]
        self._cache: DynamicCache | None = None
        self._cached_pairs = 0
        self._h_last: torch.Tensor | None = None
        self.last_scores: torch.Tensor | None = (
            None  # cumulative log-probs of the last tree's nodes
        )

    # ------------------------------------------------------------------------- features
    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._features = None
        self._cache = self.head.new_cache()
        self._cached_pairs = 0
        self._h_last = None

    def _append_features(self, rows: torch.Tensor) -> None:
        rows = rows.to(device=self.device, dtype=self.dtype)
        self._features = (
            rows if self._features is None else torch.cat([self._features, rows], dim=0)
        )

    def prefill_feedback(
        self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        self._features = None
        self._append_features(hidden)

    def update(self, feedback: VerifyFeedback) -> None:
        rows = [0, *(i + 1 for i in feedback.accepted)]  # root, then the accepted path
        self._append_features(feedback.hidden[rows])

    @property
    def num_features(self) -> int:
        return 0 if self._features is None else int(self._features.shape[0])

    # ------------------------------------------------------------------------- drafting
    @torch.inference_mode()
    def propose(self, context: torch.Tensor) -> DraftTree:
        n_ctx = int(context.numel())
        if self._features is None or self.num_features != n_ctx - 1:
            raise RuntimeError(
                f"EagleDrafter holds target features for {self.num_features} tokens but the context has {n_ctx} "
                f"(expected {n_ctx - 1}); it must be driven by SpeculativeEngine, which calls prefill_feedback "
                "and update with the target's hidden states"
            )
        if self._cache is None:
            self._cache = self.head.new_cache()
        n_pairs = n_ctx - 1  # pair j = (t[j+1], f[j])
        h_last = self._extend_committed(context, n_pairs)
        tree, scores = self._grow_tree(h_last, n_pairs)
        crop_to(self._cache, n_pairs)  # drop the tree slots; keep the committed pairs
        self.last_scores = scores
        return tree

    def _extend_committed(self, context: torch.Tensor, n_pairs: int) -> torch.Tensor:
        """Run the pairs not yet in the head cache; return the head output at the last pair."""
        assert self._features is not None and self._cache is not None
        start = self._cached_pairs
        if start == n_pairs and self._h_last is not None:  # nothing new since the last draft
            return self._h_last
        ids = context[start + 1 : n_pairs + 1].to(self.device).unsqueeze(0)  # [1, q]
        feats = self._features[start:n_pairs].unsqueeze(0)  # [1, q, H]
        q = n_pairs - start
        pos = torch.arange(start, n_pairs, device=self.device).unsqueeze(0)
        allowed = torch.ones(q, n_pairs, dtype=torch.bool, device=self.device)
        allowed[:, start:] = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        out = self.head(ids, feats, pos, additive_mask(allowed, self.dtype), self._cache)
        self._cached_pairs = n_pairs
        self._h_last = out[0, -1]
        return self._h_last

    def _grow_tree(self, h_last: torch.Tensor, n_pairs: int) -> tuple[DraftTree, torch.Tensor]:
        """EAGLE-2 expansion. Every candidate node ``u`` has a token, a parent and a score
        (cumulative log-probability); the ``top_k`` best candidates of a level are fed to
        the head (with their parent's predicted feature) to produce the next level."""
        assert self._cache is not None
        head, k = self.head, self.top_k
        logp = _log_probs(head.lm_head(h_last))  # [V]
        top = logp.topk(k)
        tokens: list[int] = top.indices.tolist()
        parents: list[int] = [-1] * k
        scores: list[float] = top.values.tolist()
        # return_probs: the distribution each node was drawn from (its parent's row) as an
        # index into `dists`, rows [V] of log-probabilities.
        dists: list[torch.Tensor] = [logp[None]] if self.return_probs else []
        node_dist: list[int] = [0] * k
        # Feeding state of the current level's expanded nodes.
        frontier = list(range(k))
        parent_feature = h_last.unsqueeze(0).expand(k, -1)  # [f, H]
        slot: dict[int, int] = {}  # node -> its slot in the head cache (after the committed pairs)
        anc_slots: dict[int, list[int]] = {-1: []}
        for d in range(1, self.depth):
            f = len(frontier)
            offset = len(slot)
            for r, u in enumerate(frontier):
                slot[u] = offset + r
                anc_slots[u] = anc_slots[parents[u]] + [slot[u]]
            kv = n_pairs + len(slot)
            allowed = torch.zeros(f, kv, dtype=torch.bool, device=self.device)
            allowed[:, :n_pairs] = True
            for r, u in enumerate(frontier):
                allowed[r, [n_pairs + s for s in anc_slots[u]]] = True
            ids = torch.tensor(
                [[tokens[u] for u in frontier]], dtype=torch.long, device=self.device
            )
            pos = torch.full((1, f), n_pairs - 1 + d, dtype=torch.long, device=self.device)
            out = head(
                ids,
                parent_feature.unsqueeze(0),
                pos,
                additive_mask(allowed, self.dtype),
                self._cache,
            )[0]
            lp = _log_probs(head.lm_head(out))  # [f, V]
            top = lp.topk(k, dim=-1)
            cum = (
                top.values
                + torch.tensor([scores[u] for u in frontier], dtype=lp.dtype, device=lp.device)[
                    :, None
                ]
            )  # [f, k]
            first_new = len(tokens)
            if self.return_probs:
                node_dist.extend(sum(d.shape[0] for d in dists) + r for r in range(f) for _ in range(k))
                dists.append(lp)
            tokens.extend(top.indices.reshape(-1).tolist())
            parents.extend(u for u in frontier for _ in range(k))
            scores.extend(cum.reshape(-1).tolist())
            if d + 1 >= self.depth:
                break
            best = cum.reshape(-1).topk(min(k, f * k)).indices.tolist()
            frontier = [first_new + b for b in best]
            parent_feature = out[[b // k for b in best]]
        probs = None
        if self.return_probs:
            probs = (torch.cat(dists), node_dist)
        return self._select(tokens, parents, scores, probs)

    def _select(
        self,
        tokens: list[int],
        parents: list[int],
        scores: list[float],
        probs: tuple[torch.Tensor, list[int]] | None = None,
    ) -> tuple[DraftTree, torch.Tensor]:
        """Keep the best ``total_tokens - 1`` candidates; ties go to the earlier node, so a
        parent (score >= its child's, created first) always precedes its children."""
        budget = self.total_tokens - 1
        order = sorted(range(len(tokens)), key=lambda u: (-scores[u], u))
        chosen: set[int] = set()
        for u in order:
            if len(chosen) >= budget:
                break
            if parents[u] == -1 or parents[u] in chosen:
                chosen.add(u)
        keep = sorted(chosen)  # creation order: parents before children
        index = {u: i for i, u in enumerate(keep)}
        # Scores are cumulative log-probabilities: a node's own (local) probability is
        # exp(score - parent's score).
        local = [scores[u] - (0.0 if parents[u] == -1 else scores[parents[u]]) for u in keep]
        node_probs = None
        if probs is not None:  # rows of log-probabilities -> each kept node's distribution
            rows, node_dist = probs
            node_probs = rows[[node_dist[u] for u in keep]].float().exp()  # [n, V]
        tree = DraftTree(
            tokens=torch.tensor([tokens[u] for u in keep], dtype=torch.long),
            parents=tuple(-1 if parents[u] == -1 else index[parents[u]] for u in keep),
            confidence=torch.tensor(local, dtype=torch.float64).exp().float(),
            probs=node_probs,
            sampled=False,
        )
        return tree, torch.tensor([scores[u] for u in keep], dtype=torch.float64)
