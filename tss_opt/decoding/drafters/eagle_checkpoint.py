"""EAGLE-1 head checkpoints: the format, saving, and loading with checks against the target.

Checkpoint format of ``yuhuili/EAGLE-Vicuna-7B-v1.3`` (SafeAILab/EAGLE ``cnets.py``): a
directory with ``config.json`` (a Llama config with ``num_hidden_layers: 1`` and an optional
``bias`` flag for ``fc``) and ``pytorch_model.bin`` (or ``model.safetensors``) with keys
``fc.weight``, ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight``
and possibly ``embed_tokens.weight``. Layer 0 has no ``input_layernorm`` (its input is the
``fc`` projection); later layers, if any, do.

Our extension: an optional ``draft_vocab`` key, a ``torch.LongTensor`` of shape
``(N,)`` with the draft vocabulary (target ids, most frequent first), and
``draft_vocab_size: N`` in ``config.json`` for people reading it. A checkpoint without it
(every EAGLE-1 checkpoint, and ours from before the extension) loads as before and drafts over the whole
vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig

from tss_opt.decoding.drafters.eagle_head import EagleHead, _causal_lm
from tss_opt.errors import TSSError

CONFIG_FILE = "config.json"
WEIGHTS_BIN = "pytorch_model.bin"
WEIGHTS_SAFETENSORS = "model.safetensors"
# Written beside a checkpoint by tss_opt.training (the target it was trained for, its data);
# the loader reads only the target's name from it, to say which model a misfit head is for.
TRAINING_FILE = "training.json"
# Keys an EAGLE-1 checkpoint may carry that the head does not own: it uses the target's.
_TARGET_OWNED = ("embed_tokens.weight",)
DRAFT_VOCAB_KEY = "draft_vocab"


class EagleHeadError(TSSError):
    """An EAGLE head checkpoint is missing or does not fit the target model."""


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
    if head.draft_vocab is not None:
        cfg["draft_vocab_size"] = int(head.draft_vocab.numel())
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
    cfg_dict.pop("draft_vocab_size", None)  # informative only; the weights file holds the list
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
    if DRAFT_VOCAB_KEY in state:
        try:
            head.set_draft_vocab(state[DRAFT_VOCAB_KEY])
        except ValueError as e:
            raise EagleHeadError(
                f"{weights_path}: its {DRAFT_VOCAB_KEY} does not fit the target's {t_vocab} tokens: {e}; "
                "use a head trained for this target model"
            ) from e
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
