"""T2D, stage 2: the kept layers as a standalone model, distilled and saved (docs/drafters.md,
"T2D"): :func:`build_student`, :func:`distill`, :func:`save_checkpoint` (interrupt-safe)."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tss_opt.config.t2d import T2DError, T2DSettings
from tss_opt.models import LoadedModel
from tss_opt.training.t2d_search import TeacherText, kl_loss

log = logging.getLogger(__name__)

__all__ = ["STATE_FILE", "build_student", "distill", "drafter_snippet", "save_checkpoint", "write_atomic"]

STATE_FILE = "t2d_state.json"  # step, keep set and loss curve of the checkpoint in the folder


def build_student(model: Any, keep: Sequence[int], layers_path: str = "model.layers") -> Any:
    """A standalone copy of ``model`` with only the decoder layers ``keep`` (in order).

    Same class and config but ``num_hidden_layers = len(keep)`` (and per-layer config lists cut
    to ``keep``); layer ``keep[j]`` becomes layer ``j``; embeddings, final norm and LM head are
    copied (tied if the target ties them). Returned in float32, eval mode, on the target's
    device.
    """
    keep = list(keep)
    cfg = copy.deepcopy(model.config)
    n_layers = int(cfg.num_hidden_layers)
    cfg.num_hidden_layers = len(keep)
    for key in ("layer_types",):  # per-layer settings follow their layer (Gemma 3, Qwen 3)
        values = getattr(cfg, key, None)
        if isinstance(values, list) and len(values) == n_layers:
            setattr(cfg, key, [values[i] for i in keep])
    if hasattr(cfg, "quantization_config"):  # a GGUF-loaded target's weights are plain already
        del cfg.quantization_config
    prefix = layers_path + "."
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(prefix):
            idx, rest = name[len(prefix):].split(".", 1)
            if int(idx) not in keep:
                continue
            name = f"{prefix}{keep.index(int(idx))}.{rest}"
        state[name] = tensor.detach().float()
    student = type(model)(cfg).float()
    missing, unexpected = student.load_state_dict(state, strict=False)
    # A tied LM head is not a separate entry in some versions' state dicts: allow that one.
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise T2DError(f"cannot copy the target's layers into a {len(keep)}-layer model: missing "
                       f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    student.tie_weights()
    student.generation_config = copy.deepcopy(model.generation_config)
    return student.to(model.device).eval()


def drafter_snippet(out_dir: Path, loaded: LoadedModel, num_layers: int, num_tokens: int) -> dict[str, Any]:
    """The ``drafter=draft_model`` config that loads the drafter saved in ``out_dir``."""
    return {
        "name": "draft_model",
        "model": {
            "name": f"t2d_{loaded.config.name}",
            "source": "hf",
            "path": str(Path(out_dir).resolve()),
            "num_layers": num_layers,
            "dtype": loaded.config.dtype,
            "device": loaded.config.device,
            "attn_implementation": loaded.config.attn_implementation,
            "layers_path": loaded.config.layers_path,
        },
        "num_tokens": num_tokens,
    }


def write_atomic(path: Path, text: str) -> None:
    """Replace the file ``path`` by ``text``: readers see the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(student: Any, tokenizer: Any, out_dir: Path, state: dict[str, Any], dtype: torch.dtype) -> None:
    """Save the drafter so that an interrupt at any moment leaves the last checkpoint loadable.

    Everything is written into a temporary folder inside ``out_dir``, then moved in with
    ``os.replace`` (atomic per file): config and tokenizer first (they never change between
    checkpoints), the weights file last, then ``t2d_state.json``. A folder whose weights file
    exists is therefore always a complete model.

    Not :func:`tss_opt.training.common.write_atomically`: that swaps in a whole new folder,
    and ``out_dir`` also holds files written between checkpoints (``drafter.yaml``, later
    ``t2d_report.json``) that the swap would drop.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".t2d-save-", dir=out_dir))
    try:
        sd = None
        if dtype != torch.float32:  # trained in float32, saved in the target's dtype
            converted: dict[int, torch.Tensor] = {}
            sd = {k: converted.setdefault(v.data_ptr(), v.to(dtype)) for k, v in student.state_dict().items()}
        student.save_pretrained(tmp, state_dict=sd)
        tokenizer.save_pretrained(tmp)
        files = sorted(tmp.iterdir())
        weights = [f for f in files if f.suffix == ".safetensors" or f.name.endswith(".index.json")]
        for f in [f for f in files if f not in weights] + weights:
            f.chmod(0o644)  # the safetensors writer leaves 0600; others may load the drafter
            os.replace(f, out_dir / f.name)
        write_atomic(out_dir / STATE_FILE, json.dumps(state, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------ distillation
def distill(
    student: Any,
    texts: Sequence[TeacherText],
    settings: T2DSettings,
    save: Callable[[int, list[float]], None],
    *,
    progress: bool = True,
    step_callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``student`` on the teacher targets with KL(teacher || student); return the loss
    per step. ``save(step, losses)`` writes a checkpoint every ``save_every`` steps and at
    the end; ``step_callback(step, loss)`` runs after every step (tests interrupt there)."""
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    frozen: set[int] = set()
    if not settings.train_embeddings:
        for emb in (student.get_input_embeddings(), student.get_output_embeddings()):
            if emb is not None:
                frozen.update(id(p) for p in emb.parameters())
    params = [p for p in student.parameters() if id(p) not in frozen]
    for p in student.parameters():
        p.requires_grad_(id(p) not in frozen)
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    order: list[int] = []
    losses: list[float] = []
    deadline = time.monotonic() + settings.train_minutes * 60 if settings.train_minutes else math.inf
    student.train()
    try:
        for step in range(1, settings.steps + 1):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for _ in range(settings.batch_size):
                if not order:  # an epoch: every text once, in a fresh order
                    order = list(range(len(texts)))
                    rng.shuffle(order)
                t = texts[order.pop()]
                logits = student(input_ids=t.ids[None].to(student.device), use_cache=False).logits[0]  # [T, V]
                loss = kl_loss(logits, t) / settings.batch_size
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(total)
            if step_callback is not None:
                step_callback(step, total)
            last = step == settings.steps or time.monotonic() >= deadline
            if step % settings.save_every == 0 or last:
                student.eval()
                save(step, losses)
                student.train()
                (log.info if progress else log.debug)("t2d distillation step %d: loss %.4f (checkpoint)", step, total)
            if last:
                break
    finally:
        student.eval()
        for p in student.parameters():
            p.requires_grad_(False)
    return losses

