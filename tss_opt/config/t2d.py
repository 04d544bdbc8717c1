"""Settings of T2D, the drafter pruned and distilled from the target (``drafter.train`` in
``conf/drafter/t2d.yaml``; used by :func:`tss_opt.training.t2d.train_t2d`). No torch here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from tss_opt.errors import TSSError

__all__ = ["T2DError", "T2DSettings"]


class T2DError(TSSError):
    """T2D cannot run as configured (a zero budget, no training text, a bad layer range)."""


@dataclass
class T2DSettings:
    """The knobs of :func:`train_t2d` (``drafter.train`` in ``conf/drafter/t2d.yaml``).

    Search: ``min_layers``..``max_layers`` kept layers (``None``: ``max(2, ceil(0.1 L))`` and
    ``max(min, round(0.3 L))`` of the target's ``L``), the first and last layer always kept
    with ``keep_first_last``; ``trials`` candidates and/or ``search_minutes``; ``objective``
    ``speedup`` (``tss_opt.training.t2d_search.speedup_estimate`` from top-1 agreement and latency) or ``kl`` (the
    lowest KL(target || pruned model), for heavy pruning where every candidate's undistilled
    agreement is near 0; fix the count, ``min_layers = max_layers``, as the latency budget);
    ``sampler``
    ``tpe`` or ``random``; ``storage`` an Optuna URL (``None``: in memory) with
    ``study_name``. ``draft_tokens`` is gamma of the speedup estimate; latency is the median
    of ``latency_reps`` one-token decode steps on a ``latency_context``-token cache.

    Data: each text is cut to its last ``max_tokens_per_text`` tokens and extended by
    ``continuation_tokens`` greedy tokens of the target under ``target_skip`` (the skip set
    it will verify with; ``[]`` = dense); the target's log-probabilities are kept for its
    ``teacher_top_k`` most likely tokens per position (the rest as one bucket).

    Distillation: ``steps`` optimizer steps and/or ``train_minutes``, ``batch_size`` texts
    per step, AdamW with ``lr`` and ``weight_decay``, embeddings and LM head frozen unless
    ``train_embeddings``; a checkpoint every ``save_every`` steps. ``probe_new_tokens``:
    tokens generated per probe prompt when comparing the drafters by speculative decoding.
    """

    min_layers: int | None = None
    max_layers: int | None = None
    keep_first_last: bool = True
    trials: int = 40
    search_minutes: float | None = None
    objective: str = "speedup"
    sampler: str = "tpe"
    storage: str | None = None
    study_name: str = "t2d"
    draft_tokens: int = 5
    latency_reps: int = 7
    latency_context: int = 64
    max_tokens_per_text: int = 256
    continuation_tokens: int = 32
    target_skip: list[int] = field(default_factory=list)
    teacher_top_k: int = 64
    steps: int = 300
    train_minutes: float | None = None
    batch_size: int = 1
    lr: float = 2e-4
    weight_decay: float = 0.0
    train_embeddings: bool = False
    save_every: int = 50
    probe_new_tokens: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, expected: str) -> None:
            if not ok:
                raise T2DError(f"t2d {key}={getattr(self, key)!r} is invalid; expected {expected}")

        def positive_int(key: str, minimum: int = 1) -> None:
            v = getattr(self, key)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= minimum, key, f"an integer >= {minimum}")

        need(self.trials != 0, "trials", "at least 1 search trial (a zero budget searches nothing)")
        need(self.steps != 0, "steps", "at least 1 distillation step (a zero budget trains nothing; "
             "the undistilled drafter is drafter=self with the dropped layers as skip)")
        for key in ("trials", "steps", "draft_tokens", "latency_reps", "latency_context",
                    "max_tokens_per_text", "teacher_top_k", "batch_size", "save_every"):
            positive_int(key)
        for key in ("continuation_tokens", "probe_new_tokens"):
            positive_int(key, 0)
        for key in ("search_minutes", "train_minutes"):
            v = getattr(self, key)
            need(v is None or (isinstance(v, (int, float)) and v > 0), key,
                 "a positive number of minutes, or null for no time limit (a zero budget does nothing)")
        need(self.sampler in ("tpe", "random"), "sampler", "tpe or random")
        need(self.objective in ("speedup", "kl"), "objective", "speedup or kl")
        need(self.lr > 0, "lr", "a positive learning rate")
        need(self.weight_decay >= 0, "weight_decay", "a number >= 0")
        for key in ("min_layers", "max_layers"):
            v = getattr(self, key)
            need(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1), key,
                 "an integer >= 1 (kept layers), or null for the default")
        self.target_skip = sorted(int(i) for i in self.target_skip)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> T2DSettings:
        """Settings from a mapping (``drafter.train``); an unknown key is a :class:`T2DError`."""
        plain = dict(values or {})
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(values, DictConfig):
                plain = OmegaConf.to_container(values, resolve=True)  # type: ignore[assignment]
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            pass
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(plain) - set(names))
        if unknown:
            raise T2DError(f"unknown t2d setting(s) {', '.join(unknown)}; the settings are: {', '.join(names)}")
        return cls(**plain)

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """``(lo, hi)``: how many layers a drafter of a ``num_layers``-layer target keeps."""
        lo = self.min_layers if self.min_layers is not None else max(2, math.ceil(0.1 * num_layers))
        hi = self.max_layers if self.max_layers is not None else max(lo, round(0.3 * num_layers))
        pinned = 2 if self.keep_first_last and num_layers > 1 else 0
        if lo > hi:
            raise T2DError(f"t2d min_layers={lo} exceeds max_layers={hi}; give min_layers <= max_layers")
        if hi >= num_layers:
            raise T2DError(
                f"t2d max_layers={hi} keeps every layer of the {num_layers}-layer target; a drafter must "
                f"drop at least one: set max_layers <= {num_layers - 1}"
            )
        if lo < pinned:
            raise T2DError(
                f"t2d min_layers={lo} is below the {pinned} layers keep_first_last pins (first and last); "
                "raise min_layers or set keep_first_last=false"
            )
        bad = [i for i in self.target_skip if not 0 <= i < num_layers]
        if bad:
            raise T2DError(
                f"t2d target_skip layer(s) {bad} out of range: the target has {num_layers} decoder layers, "
                f"valid indices are 0..{num_layers - 1}"
            )
        return lo, hi

