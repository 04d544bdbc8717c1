"""The drafter-training schema (``train:`` in ``conf/config.yaml``): budget, optimiser, data
and probe settings of ``python -m tss_opt.cli.train_drafter``.

Training itself is :mod:`tss_opt.training`; this module is only the schema, so that composing
a configuration imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TRAIN_SOURCES", "TrainSettings"]

# Where a domain's training text comes from (``train.sources``).
TRAIN_SOURCES = ("calibration", "extra")


@dataclass
class TrainSettings:
    """Settings of drafter training (docs/drafters.md, "Training an EAGLE head").

    Attributes:
        max_minutes: wall-time budget of the optimisation loop (data preparation and the
            probes before the first step are not counted); ``None`` = no time limit.
        max_steps: optimiser steps; ``None`` = no step limit. At least one of the two is set.
        lr: AdamW learning rate (after a linear warm-up of ``warmup_steps``).
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up from 0.
        grad_clip: gradient-norm clip (EAGLE: 0.5); 0 = none.
        batch_size: rows per optimiser step.
        seq_len: token pairs per row (sequences are packed into rows; attention never crosses
            from one sequence into another).
        ce_weight: weight of the token term against the feature term (EAGLE-1: 0.1).
        ce_positions: positions per step that get the token term (its ``lm_head`` over the
            vocabulary dominates the step's cost on a 49k vocabulary); ``None`` = all.
        ce_target: ``greedy`` (cross-entropy against the target's greedy next token) or
            ``distribution`` (against the target's next-token distribution, EAGLE-1's choice;
            one more ``lm_head`` per position).
        feature_noise: amplitude of the uniform noise added to input features (EAGLE-1: 0.2),
            so that the head tolerates its own imperfect features when drafting deeper levels.
        seed: seeds the head's initialisation, the row order and the noise.
        sources: where the text comes from: ``calibration`` (the domain's calibration
            prompts; never its validation or held-out prompts) and ``extra`` (the domain's
            ``train_data`` records, disjoint from the pool).
        extra_prompts: extra records used per domain (the first ones of the file); ``None`` =
            all.
        continuation_tokens: greedy tokens the plain target generates after every prompt
            (the text the drafter will be asked to predict); 0 = prompts only.
        generation_batch: 1 (default): each prompt is decoded by the engine (lossless prompt
            lookup) and the features are read off its forwards, one pass per prompt; > 1:
            batched ``generate`` of that many prompts, then a second forward for the features
            (faster on a GPU).
        generated_tokens: data-free distillation: sample about this many tokens of
            text from the target itself (continuations of the training prompts and of the
            shipped generic chat prompts, ``tss_opt/data/train/chat_prompts.jsonl``) and train on it
            too; 0 = none (only the prompts and their greedy continuations).
        sample_tokens: tokens per sampled continuation (fewer when EOS comes first).
        sample_temperature: the temperature of the sampled continuations (> 0).
        chat_prompts: also continue the shipped generic chat prompts (not only the domains'
            training prompts).
        draft_vocab: the checkpoint keeps this many most frequent tokens of the training
            text, in order (FR-Spec's draft vocabulary); the drafter projects onto them only
            (``drafter.draft_vocab``); 0 = none (the head drafts over the whole vocabulary).
        checkpoint_every: steps between checkpoints (one is always written at the end and on
            Ctrl-C); 0 = only at the end.
        probe_every: steps between accepted-length probes (one runs before training, on the
            random head, and one at the end); 0 = only those two.
        probe_prompts: calibration prompts of the probe (round-robin over the domains); 0 =
            no probe.
        probe_tokens: new tokens per probe prompt.
        out_dir: checkpoints go to ``<out_dir>/<model>/<domain>`` (``general`` for all domains).
        general: train one head on every domain together (no ``+domain``).
        domains: the domains of a multi-domain head (``[]`` with ``general`` = all).
        resume: start from the checkpoint already in the output directory (its weights; the
            optimiser starts afresh) instead of a random head.
        progress: show a progress bar (loss, token accuracy, last probe).
    """

    max_minutes: float | None = 30.0
    max_steps: int | None = None
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 0.5
    batch_size: int = 4
    seq_len: int = 256
    ce_weight: float = 0.1
    ce_positions: int | None = 256
    ce_target: str = "greedy"
    feature_noise: float = 0.2
    seed: int = 0
    sources: list[str] = field(default_factory=lambda: list(TRAIN_SOURCES))
    extra_prompts: int | None = 256
    continuation_tokens: int = 64
    generation_batch: int = 1
    generated_tokens: int = 0
    sample_tokens: int = 128
    sample_temperature: float = 0.8
    chat_prompts: bool = True
    draft_vocab: int = 8192
    checkpoint_every: int = 100
    probe_every: int = 200
    probe_prompts: int = 2
    probe_tokens: int = 32
    out_dir: str = "storage/drafters"
    general: bool = False
    domains: list[str] = field(default_factory=list)
    resume: bool = False
    progress: bool = True
