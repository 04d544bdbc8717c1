"""What every drafter trainer shares: settings checks, the budget, checkpoint writes that an
interrupt cannot tear, and freezing the target while a drafter learns from it.

Library code: the command (``tss_opt.cli.train_drafter``) builds the objects and calls the
trainers; nothing here parses a command line.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tss_opt.config.train import TRAIN_SOURCES, TrainSettings
from tss_opt.errors import TSSError, UsageError

__all__ = [
    "Budget",
    "TrainingDataError",
    "TrainingSettingsError",
    "check_settings",
    "deferred_sigint",
    "frozen",
    "left_padded",
    "write_atomically",
]

CE_TARGETS = ("greedy", "distribution")


class TrainingSettingsError(UsageError):
    """A ``train.*`` setting is out of range; the message names the key and the fix."""


class TrainingDataError(TSSError):
    """A domain gives no text to train on, or its text cannot be used."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_settings(s: TrainSettings) -> None:
    """Reject settings no training can run with, naming the key, the value and the fix.

    Raises:
        TrainingSettingsError: a zero or negative budget, no budget at all, a non-positive
            learning rate or size, an unknown ``ce_target`` or source.
    """

    def bad(key: str, value: Any, expected: str) -> TrainingSettingsError:
        return TrainingSettingsError(f"train.{key}={value!r} is invalid; expected {expected}")

    if s.max_minutes is None and s.max_steps is None:
        raise TrainingSettingsError(
            "train.max_minutes and train.max_steps are both null: training would never stop; "
            "set a wall-time budget (train.max_minutes=30) or a step budget (train.max_steps=1000)"
        )
    if s.max_minutes is not None and (
        isinstance(s.max_minutes, bool)
        or not isinstance(s.max_minutes, (int, float))
        or not math.isfinite(s.max_minutes)
        or s.max_minutes <= 0
    ):
        raise bad("max_minutes", s.max_minutes, "a number of minutes > 0 (or null for a step budget only)")
    if s.max_steps is not None and (not _is_int(s.max_steps) or s.max_steps < 1):
        raise bad("max_steps", s.max_steps, "an integer >= 1 (or null for a time budget only)")
    if not (isinstance(s.lr, (int, float)) and s.lr > 0 and math.isfinite(s.lr)):
        raise bad("lr", s.lr, "a learning rate > 0, e.g. 1e-3")
    for key in ("batch_size", "generation_batch"):
        if not _is_int(getattr(s, key)) or getattr(s, key) < 1:
            raise bad(key, getattr(s, key), "an integer >= 1")
    if not _is_int(s.seq_len) or s.seq_len < 2:
        raise bad("seq_len", s.seq_len, "an integer >= 2 (token pairs per row)")
    for key in ("generated_tokens", "draft_vocab"):
        if not _is_int(getattr(s, key)) or getattr(s, key) < 0:
            raise bad(key, getattr(s, key), "an integer >= 0 (0 = off)")
    if not _is_int(s.sample_tokens) or s.sample_tokens < 1:
        raise bad("sample_tokens", s.sample_tokens, "an integer >= 1 (tokens per sampled continuation)")
    t = s.sample_temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise bad("sample_temperature", t, "a temperature > 0, e.g. 0.8")
    for key in ("warmup_steps", "continuation_tokens", "checkpoint_every", "probe_every", "probe_prompts"):
        if not _is_int(getattr(s, key)) or getattr(s, key) < 0:
            raise bad(key, getattr(s, key), "an integer >= 0")
    if not _is_int(s.probe_tokens) or s.probe_tokens < 1:
        raise bad("probe_tokens", s.probe_tokens, "an integer >= 1")
    for key in ("ce_weight", "weight_decay", "grad_clip", "feature_noise"):
        value = getattr(s, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad(key, value, "a number >= 0")
    if s.ce_positions is not None and (not _is_int(s.ce_positions) or s.ce_positions < 1):
        raise bad("ce_positions", s.ce_positions, "an integer >= 1, or null for every position")
    if s.extra_prompts is not None and (not _is_int(s.extra_prompts) or s.extra_prompts < 0):
        raise bad("extra_prompts", s.extra_prompts, "an integer >= 0, or null for all")
    if s.ce_target not in CE_TARGETS:
        raise bad("ce_target", s.ce_target, f"one of {', '.join(CE_TARGETS)}")
    unknown = [x for x in s.sources if x not in TRAIN_SOURCES]
    if unknown or not s.sources:
        raise bad("sources", list(s.sources), f"a non-empty list of {', '.join(TRAIN_SOURCES)}")


@dataclass
class Budget:
    """A wall-time and/or step budget, started by :meth:`start`.

    Attributes:
        max_steps: ``None`` = no step limit.
        max_seconds: ``None`` = no time limit.
    """

    max_steps: int | None
    max_seconds: float | None
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def of(cls, settings: TrainSettings) -> Budget:
        seconds = None if settings.max_minutes is None else 60.0 * float(settings.max_minutes)
        return cls(max_steps=settings.max_steps, max_seconds=seconds)

    def start(self) -> None:
        self.started = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def exhausted(self, steps_done: int) -> bool:
        if self.max_steps is not None and steps_done >= self.max_steps:
            return True
        return self.max_seconds is not None and self.elapsed >= self.max_seconds

    def describe(self) -> str:
        parts = []
        if self.max_steps is not None:
            parts.append(f"{self.max_steps} steps")
        if self.max_seconds is not None:
            parts.append(f"{self.max_seconds / 60:g} min")
        return " or ".join(parts)


@contextmanager
def deferred_sigint() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block is done, then raise :class:`KeyboardInterrupt`.

    For the few renames that swap a checkpoint in: an interrupt between them would leave no
    checkpoint at all. Outside the main thread (where signals cannot be handled) it does
    nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def write_atomically(directory: str | Path, write: Callable[[Path], None]) -> Path:
    """Replace ``directory`` by what ``write`` puts into a fresh temporary directory.

    ``write(tmp)`` fills a hidden sibling directory; only when it returns is the old
    directory swapped out (two renames, Ctrl-C held back) and removed. An interrupt or crash
    while writing leaves the previous checkpoint in place, never a half-written one. A swap
    cut short by a hard kill (between the two renames) is undone by the next call.

    Returns:
        ``directory`` as a :class:`Path`.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    old = directory.with_name(f".{directory.name}.old")
    if old.exists() and not directory.exists():  # a swap cut short: put the last one back
        os.rename(old, directory)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the checkpoint private
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with deferred_sigint():
        if old.exists():
            shutil.rmtree(old)
        if directory.exists():
            os.rename(directory, old)
        os.rename(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


@contextmanager
def frozen(module: Any) -> Iterator[None]:
    """Turn off ``requires_grad`` of every parameter of ``module`` (the target) for the
    block, restoring each flag afterwards (also on errors).

    A head shares the target's ``embed_tokens`` and ``lm_head``: with their gradients on,
    every step would compute a (vocab x hidden) weight gradient nobody uses.
    """
    params = list(module.parameters())
    before = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in zip(params, before):
            p.requires_grad_(flag)


def left_padded(prompts: Sequence[Any], pad: int) -> tuple[Any, Any]:
    """Prompts of shape ``(P_b,)`` as one left-padded batch for ``generate``: ``ids`` and
    ``attention_mask``, both ``(B, max P_b)`` long (left padding puts every prompt's end last)."""
    import torch  # here: this module is imported by commands that never build a batch

    width = max(int(p.numel()) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        n = int(p.numel())
        ids[r, width - n :] = p
        mask[r, width - n :] = 1
    return ids, mask
