"""Training an EAGLE-1 head by self-distillation from its target (Li et al. 2024, arXiv
2401.15077, Section 4.3).

The head (``tss_opt.decoding.drafters.eagle.EagleHead``) learns, for every pair
``j = (t[j+1], f[j])`` of the training text, to predict the target's next feature ``f[j+1]``:

    loss = SmoothL1(f_hat[j+1], f[j+1]) + ce_weight * CE(lm_head(f_hat[j+1]), y[j+2])

where ``y[j+2]`` is the target's own greedy next token (``ce_target=greedy``) or its whole
next-token distribution ``softmax(lm_head(f[j+1]))`` (``ce_target=distribution``, EAGLE-1's
choice), and ``lm_head`` is the target's, frozen. Input features get uniform noise
(``feature_noise``), as in EAGLE-1, so the head tolerates its own imperfect features when it
drafts deeper tree levels. The features are computed once (:mod:`tss_opt.training.features`);
the loop only runs the head, so a CPU can afford it.

Checkpoints are written in the EAGLE-1 format the loader reads (``config.json`` +
``pytorch_model.bin``, plus a ``training.json`` the loader ignores), atomically, every
``checkpoint_every`` steps, at the end and on Ctrl-C. A periodic probe runs real EAGLE
speculative decoding (``SpeculativeEngine`` + ``EagleDrafter``) on a few calibration prompts
and reports the accepted length.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tss_opt.config.objectives import ACCEPT_LENGTH
from tss_opt.decoding.drafters.eagle import (
    TRAINING_FILE,
    EagleDrafter,
    EagleHead,
    additive_mask,
    frequent_tokens,
    load_eagle_head,
    random_eagle_head,
    save_eagle_head,
)
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.training.common import (
    Budget,
    TrainingSettingsError,
    check_settings,
    frozen,
    write_atomically,
)
from tss_opt.training.features import Batch, FeatureSet

if TYPE_CHECKING:
    from tss_opt.config.train import TrainSettings
    from tss_opt.decoding.target import TargetModel

__all__ = [
    "EagleTrainResult",
    "LossParts",
    "TrainingInterrupted",
    "clone_head",
    "eagle_loss",
    "evaluate_loss",
    "probe_accept_length",
    "save_checkpoint",
    "train_eagle",
]

log = logging.getLogger("tss_opt.training")
EVAL_ROWS = 8  # rows of the fixed loss-evaluation batch


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training, after the last state was saved.

    Attributes:
        checkpoint: the loadable checkpoint directory.
        steps: optimiser steps done (this run plus a resumed checkpoint's).
    """

    def __init__(self, checkpoint: Path, steps: int) -> None:
        super().__init__(f"interrupted at step {steps}; checkpoint {checkpoint}")
        self.checkpoint = checkpoint
        self.steps = steps


@dataclass
class LossParts:
    """One evaluation of the objective (floats, for logs and the summary)."""

    loss: float
    feature: float  # SmoothL1 of the predicted features
    token: float  # cross-entropy of lm_head(predicted feature)
    accuracy: float  # share of positions where its argmax is the target's greedy token


@dataclass
class EagleTrainResult:
    """What a training run did.

    Attributes:
        steps: optimiser steps of this run.
        total_steps: including a resumed checkpoint's steps.
        seconds: wall time of the optimisation loop (probes included).
        pairs_per_s: training pairs processed per second of the loop.
        initial, final: the objective on a fixed batch of training rows before and after.
        probe_before, probe_after: accepted length of the probe (``None`` without probe
            prompts); before = the random (or resumed) head.
        checkpoint: the checkpoint directory.
        history: one dict per probe: step, seconds, loss, accuracy, accepted length.
    """

    steps: int
    total_steps: int
    seconds: float
    pairs_per_s: float
    initial: LossParts
    final: LossParts
    probe_before: float | None
    probe_after: float | None
    checkpoint: Path
    history: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------- the objective
def _lm_weight(head: EagleHead) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's ``lm_head`` weight (and bias) in float32, without gradients."""
    w = head.lm_head.weight.detach()
    b = getattr(head.lm_head, "bias", None)
    return w.float(), (None if b is None else b.detach().float())


def eagle_loss(
    head: EagleHead,
    batch: Batch,
    settings: TrainSettings,
    lm: tuple[torch.Tensor, torch.Tensor | None],
    generator: torch.Generator | None = None,
    noise: bool = True,
) -> tuple[torch.Tensor, LossParts]:
    """EAGLE-1's objective on one batch.

    Args:
        head: the head (float32 parameters).
        batch: rows of pairs (:meth:`FeatureSet.batch`).
        lm: the target's ``lm_head`` weight ``(V, H)`` and bias, float32, frozen.
        generator: draws the noise and the positions of the token term (seeded: the same
            generator state gives the same loss).
        noise: add ``feature_noise`` to the input features (off for evaluation).

    Returns:
        ``(loss, parts)``: the differentiable scalar and its parts as floats.
    """
    feats = batch.features
    if noise and settings.feature_noise > 0:
        u = torch.rand(feats.shape, generator=generator, device="cpu").to(feats.device)
        feats = feats + (u - 0.5) * settings.feature_noise
    mask = additive_mask(batch.allowed, feats.dtype)[0, 0].unsqueeze(1)  # [B, 1, L, L]
    pred = head(batch.input_ids, feats, batch.position_ids, mask)  # [B, L, H]
    v = batch.valid
    pred_v, target_v = pred[v], batch.target_features[v]  # [n, H]
    feature = F.smooth_l1_loss(pred_v, target_v)
    n = pred_v.shape[0]
    # The token term needs lm_head over the whole vocabulary per position: on a small head
    # that is most of the step's cost, so it is computed on a random subset of positions.
    k = n if settings.ce_positions is None else min(n, int(settings.ce_positions))
    sel = torch.randperm(n, generator=generator, device="cpu")[:k].to(pred_v.device)
    w, b = lm
    logits = F.linear(pred_v[sel], w, b)  # [k, V]
    labels = batch.labels[v][sel]
    if settings.ce_target == "distribution":
        with torch.no_grad():
            p = torch.softmax(F.linear(target_v[sel], w, b), dim=-1)  # the target's own
        token = -(p * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    else:
        token = F.cross_entropy(logits, labels)
    loss = feature + settings.ce_weight * token
    with torch.no_grad():
        acc = float((logits.argmax(-1) == labels).float().mean()) if k else 0.0
    return loss, LossParts(loss.item(), feature.item(), token.item(), acc)


@torch.no_grad()
def evaluate_loss(head: EagleHead, batches: Sequence[Batch], settings: TrainSettings, seed: int = 0) -> LossParts:
    """The objective without noise on fixed batches, with seeded token-term positions: the
    same head gives the same value, so before/after comparisons are exact."""
    g = torch.Generator().manual_seed(seed)
    lm = _lm_weight(head)
    parts = [eagle_loss(head, b, settings, lm, g, noise=False)[1] for b in batches]
    n = max(len(parts), 1)
    return LossParts(*(sum(getattr(p, f) for p in parts) / n for f in ("loss", "feature", "token", "accuracy")))


# ----------------------------------------------------------------------------- probe
def clone_head(head: EagleHead, dtype: torch.dtype | None = None) -> EagleHead:
    """A copy of ``head``'s weights (sharing the target's embeddings and ``lm_head``), in
    ``dtype``; ``copy.deepcopy`` would copy the target's modules along."""
    import copy

    p = next(head.parameters())
    first_norm = not isinstance(head.layers[0].input_layernorm, torch.nn.Identity)
    new = EagleHead(copy.deepcopy(head.config), head.embed_tokens, head.lm_head, bias=head.has_bias, first_layer_norm=first_norm)
    new.set_draft_vocab(head.draft_vocab)  # before loading: the state dict holds it
    new.load_state_dict(head.state_dict())
    return new.to(device=p.device, dtype=dtype or p.dtype).eval()


def probe_tree(drafter_settings: Mapping[str, Any] | None) -> dict[str, int]:
    """The probe's tree from the drafter's settings: its fixed ``total_tokens``, ``depth`` and
    ``top_k``. A size left to the hardware (``total_tokens: auto``, the drafter's default) is
    not a tree the probe can draft (sizing needs the head being trained, and a tree that
    switches with the host's load would make probes incomparable), so the probe keeps
    :func:`probe_accept_length`'s fixed default for it (EAGLE-2's 60 tokens)."""
    return {
        k: int(v) for k, v in (drafter_settings or {}).items()
        if k in ("total_tokens", "depth", "top_k") and isinstance(v, int) and not isinstance(v, bool)
    }


@torch.inference_mode()
def probe_accept_length(
    target: TargetModel,
    head: EagleHead,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int = 32,
    eos_token_ids: Sequence[int] = (),
    skip: Sequence[int] = (),
    total_tokens: int = 60,
    depth: int = 6,
    top_k: int = 8,
) -> float:
    """Accepted length of real EAGLE speculative decoding (greedy) with ``head``.

    Args:
        prompts: ``torch.LongTensor`` of shape ``(P_i,)`` each.
        skip: the target's skip set during verification (default dense).

    Returns:
        Tokens committed by verification steps per step over all prompts, the bonus token
        included (Spec-Bench's convention: 1.0 = nothing accepted).
    """
    run = head if head.fc.weight.dtype == target.dtype else clone_head(head, target.dtype)
    was_training = run.training
    run.eval()
    engine = SpeculativeEngine(target, EagleDrafter(run, total_tokens=total_tokens, depth=depth, top_k=top_k), eos_token_ids=eos_token_ids)
    steps = tokens = 0
    try:
        for ids in prompts:
            stats = engine.generate(ids, max_new_tokens=max_new_tokens, skip=skip).stats
            steps += stats.steps
            tokens += stats.step_tokens
    finally:
        run.train(was_training)
    return tokens / steps if steps else 1.0


# ----------------------------------------------------------------------------- checkpoints
def save_checkpoint(head: EagleHead, directory: str | Path, metadata: dict[str, Any]) -> Path:
    """Write ``head`` in the EAGLE-1 format plus ``training.json``, atomically: the
    directory holds either the previous checkpoint or this one, whatever interrupts."""

    def write(tmp: Path) -> None:
        save_eagle_head(head, tmp)
        (tmp / TRAINING_FILE).write_text(json.dumps(metadata, indent=2, default=str) + "\n", encoding="utf-8")

    return write_atomically(directory, write)


def read_training_metadata(directory: str | Path) -> dict[str, Any]:
    """The ``training.json`` beside a checkpoint (``{}`` when absent or unreadable)."""
    path = Path(directory) / TRAINING_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


# ----------------------------------------------------------------------------- the loop
def _starting_head(target: TargetModel, checkpoint_dir: Path, settings: TrainSettings) -> tuple[EagleHead, int]:
    """The head to train (the checkpoint's when resuming, else a random one) and the steps it
    already had, in float32 on the target's device."""
    prior = read_training_metadata(checkpoint_dir) if settings.resume else {}
    if settings.resume and (checkpoint_dir / "config.json").is_file():
        head = load_eagle_head(checkpoint_dir, target.model)
        done_before = int(prior.get("total_steps", 0))
        log.info("resuming from %s (%d steps)", checkpoint_dir, done_before)
    else:
        if settings.resume:
            log.warning("train.resume=true but %s holds no checkpoint: starting from a random head", checkpoint_dir)
        head = random_eagle_head(target.model, seed=settings.seed)
        done_before = 0
    # Master weights in float32 whatever the target's dtype (bfloat16 updates lose small steps).
    return head.to(device=target.device, dtype=torch.float32).train(), done_before


@dataclass
class _Run:
    """One training run's fixed parts and its record: probes, loss history, checkpoint metadata.

    ``history`` gets one entry per probe (step, seconds, loss parts, accepted length); the
    checkpoint's ``training.json`` carries it with ``metadata`` and the settings.
    """

    target: TargetModel
    head: EagleHead
    settings: TrainSettings
    checkpoint_dir: Path
    done_before: int
    probe_prompts: Sequence[torch.Tensor]
    tree: dict[str, Any]
    eos_token_ids: Sequence[int]
    metadata: dict[str, Any]
    on_probe: Callable[[dict[str, Any]], None] | None
    history: list[dict[str, Any]] = field(default_factory=list)
    probe_before: float | None = None

    def probe(self) -> float | None:
        """The accepted length of real EAGLE decoding on the probe prompts (``None``: none)."""
        if not self.probe_prompts:
            return None
        return probe_accept_length(
            self.target, self.head, self.probe_prompts, self.settings.probe_tokens, self.eos_token_ids, **self.tree
        )

    def record(self, step: int, seconds: float, parts: LossParts, a: float | None) -> None:
        entry = {
            "step": step, "seconds": round(seconds, 2), "loss": parts.loss, "feature": parts.feature,
            "token": parts.token, "accuracy": parts.accuracy, ACCEPT_LENGTH: a,
        }
        self.history.append(entry)
        if self.on_probe is not None:
            self.on_probe(entry)

    def meta(self, steps: int, seconds: float, last: LossParts | None) -> dict[str, Any]:
        """``training.json`` after ``steps`` steps of this run."""
        settings = self.settings
        return {
            **self.metadata,
            "format": "EAGLE-1 head (tss_opt.training.eagle)",
            "total_steps": self.done_before + steps,
            "steps": steps,
            "seconds": round(seconds, 2),
            "loss": None if last is None else asdict(last),
            "probe_before": self.probe_before,
            "history": self.history,
            "settings": asdict(settings) if hasattr(settings, "__dataclass_fields__") else dict(settings),  # type: ignore[call-overload]
        }

    def save(self, steps: int, seconds: float, last: LossParts | None, **extra: Any) -> None:
        save_checkpoint(self.head, self.checkpoint_dir, {**self.meta(steps, seconds, last), **extra})


def _optimise(
    head: EagleHead,
    opt: torch.optim.Optimizer,
    batch: Batch,
    settings: TrainSettings,
    lm: tuple[torch.Tensor, torch.Tensor | None],
    gen: torch.Generator,
    step: int,
) -> LossParts:
    """One optimiser step at 0-based ``step`` (linear warm-up of the learning rate).

    Raises:
        TrainingSettingsError: the loss is no longer finite (the last checkpoint stays).
    """
    lr = settings.lr * min(1.0, (step + 1) / settings.warmup_steps) if settings.warmup_steps else settings.lr
    for g in opt.param_groups:
        g["lr"] = lr
    loss, parts = eagle_loss(head, batch, settings, lm, gen)
    if not math.isfinite(parts.loss):
        raise TrainingSettingsError(f"the loss became {parts.loss} at step {step + 1}; lower train.lr (now {settings.lr})")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if settings.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(head.parameters(), settings.grad_clip)
    opt.step()
    return parts


def train_eagle(
    target: TargetModel,
    features: FeatureSet,
    settings: TrainSettings,
    checkpoint_dir: str | Path,
    *,
    probe_prompts: Sequence[torch.Tensor] = (),
    drafter_settings: dict[str, Any] | None = None,
    eos_token_ids: Sequence[int] = (),
    metadata: dict[str, Any] | None = None,
    on_probe: Callable[[dict[str, Any]], None] | None = None,
) -> EagleTrainResult:
    """Train an EAGLE-1 head for ``target`` on ``features`` within the budget.

    Args:
        target: the target whose features were extracted (its ``embed_tokens`` and
            ``lm_head`` are shared with the head and stay frozen).
        features: :func:`tss_opt.training.features.extract_features` of the training text.
        settings: ``train.*`` (budget, optimiser, probe).
        checkpoint_dir: where the checkpoint goes (replaced atomically at each save).
        probe_prompts: prompts of the accepted-length probe (none: no probe).
        drafter_settings: the probe's tree (``total_tokens``, ``depth``, ``top_k``).
        metadata: written into ``training.json`` (model, domains, data counts ...).
        on_probe: called with each probe's record (for logs and tests).

    Raises:
        TrainingSettingsError: settings no training can run with.
        TrainingInterrupted: Ctrl-C; the current head was saved first (loadable).
    """
    check_settings(settings)
    checkpoint_dir = Path(checkpoint_dir)
    head, done_before = _starting_head(target, checkpoint_dir, settings)
    # The draft vocabulary: the training text's most frequent tokens (prompts and continuations:
    # what the head will be asked to draft). The probe drafts from it, as decoding will.
    head.set_draft_vocab(frequent_tokens(features.tokens, settings.draft_vocab) if settings.draft_vocab else None)
    run = _Run(
        target=target, head=head, settings=settings, checkpoint_dir=checkpoint_dir, done_before=done_before,
        probe_prompts=probe_prompts,
        tree=probe_tree(drafter_settings),
        eos_token_ids=eos_token_ids, metadata=dict(metadata or {}), on_probe=on_probe,
    )
    device = target.device
    lm = _lm_weight(head)
    opt = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    gen = torch.Generator().manual_seed(settings.seed)
    batches = features.epochs(settings.seq_len, settings.batch_size, settings.seed)
    eval_rows = features.rows(settings.seq_len)[:EVAL_ROWS]
    eval_batches = [
        features.batch(eval_rows[i : i + settings.batch_size], settings.seq_len, device)
        for i in range(0, len(eval_rows), settings.batch_size)
    ]

    with frozen(target.model):
        initial = last_eval = evaluate_loss(head, eval_batches, settings)
        run.probe_before = run.probe()
        run.record(0, 0.0, initial, run.probe_before)
        budget = Budget.of(settings)
        log.info(
            "training an EAGLE head on %d pairs for %s -> %s", features.num_pairs, budget.describe(), checkpoint_dir
        )
        budget.start()
        step, pairs, last = 0, 0, initial
        from tss_opt.progress import progress_bar

        # Drawn on a terminal only (no bar garbage in logs; TQDM_DISABLE honoured).
        bar = progress_bar(settings.max_steps, "training EAGLE head", unit="step", enabled=settings.progress)
        postfix: dict[str, str] = {"A": "-" if run.probe_before is None else f"{run.probe_before:.2f}"}
        try:
            while not budget.exhausted(step):
                batch = features.batch(next(batches), settings.seq_len, device)
                last = _optimise(head, opt, batch, settings, lm, gen, step)
                step += 1
                pairs += int(batch.valid.sum())
                postfix.update(loss=f"{last.loss:.3f}", acc=f"{last.accuracy:.2f}")
                if settings.probe_every and step % settings.probe_every == 0:
                    a = run.probe()
                    last_eval = evaluate_loss(head, eval_batches, settings)
                    run.record(done_before + step, budget.elapsed, last_eval, a)
                    if a is not None:
                        postfix["A"] = f"{a:.2f}"
                if settings.checkpoint_every and step % settings.checkpoint_every == 0:
                    run.save(step, budget.elapsed, last)
                bar.set_postfix(postfix, refresh=False)
                bar.update(1)
        except KeyboardInterrupt:
            bar.close()
            run.save(step, budget.elapsed, last, interrupted=True)
            raise TrainingInterrupted(checkpoint_dir, done_before + step) from None
        bar.close()
        seconds = budget.elapsed
        if run.history[-1]["step"] == done_before + step:  # the last probe ran at this very step
            final, probe_after = last_eval, run.history[-1][ACCEPT_LENGTH]
        else:
            final = evaluate_loss(head, eval_batches, settings)
            probe_after = run.probe()
            run.record(done_before + step, seconds, final, probe_after)
        run.save(step, seconds, final)
    return EagleTrainResult(
        steps=step,
        total_steps=done_before + step,
        seconds=seconds,
        pairs_per_s=pairs / seconds if seconds > 0 else 0.0,
        initial=initial,
        final=final,
        probe_before=run.probe_before,
        probe_after=probe_after,
        checkpoint=checkpoint_dir,
        history=run.history,
    )
