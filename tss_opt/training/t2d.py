"""T2D: a drafter pruned and distilled from the target (docs/drafters.md, "T2D").

Two stages, as T2D describes them (TSS.md, "Related systems"): a drafter-side twin of what the
search does on the target side.

1. **Search** (``t2d_search.search_keep_set``): an Optuna study over which of the target's
   decoder layers the drafter keeps. Each candidate is scored by the speedup it predicts
   (``speedup_estimate``) from its measured per-token drafting latency and its top-1 agreement
   with the target on the training text (teacher forcing), or by its KL to the target.
2. **Distillation** (``t2d_student.distill``): a copy of the kept layers, with the embeddings,
   final norm and LM head (tied as the target ties them), becomes a standalone causal LM
   trained with KL(target || student) on the target's output distributions over the training
   text and the target's own greedy continuations of it.

The result is saved with ``save_pretrained`` (plus the tokenizer) and loads as
``drafter=draft_model`` (``drafter.yaml`` in the output folder holds the snippet) or
``drafter=t2d drafter.path=DIR``. Undistilled, the same keep set is the self-drafter
(``drafter=self``, ``skip`` = the dropped layers); the report compares the two. Verification is
untouched, so either drafter stays lossless under any target skip set (TSS on top).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tss_opt.config.t2d import T2DError, T2DSettings
from tss_opt.models import LoadedModel
from tss_opt.training.t2d_search import (
    CandidateRecord,
    decode_latency,
    prepare_texts,
    score,
    search_keep_set,
    speedup_estimate,
)
from tss_opt.training.t2d_student import (
    STATE_FILE,
    build_student,
    distill,
    drafter_snippet,
    save_checkpoint,
    write_atomic,
)

log = logging.getLogger(__name__)

__all__ = [
    "DRAFTER_FILE",
    "REPORT_FILE",
    "STATE_FILE",
    "CandidateRecord",
    "T2DError",
    "T2DReport",
    "T2DSettings",
    "build_student",
    "drafter_snippet",
    "speedup_estimate",
    "train_t2d",
]

REPORT_FILE = "t2d_report.json"
DRAFTER_FILE = "drafter.yaml"


@dataclass
class T2DReport:
    """What :func:`train_t2d` did and measured (``t2d_report.json`` in the output folder).

    Agreements are top-1 agreement with the teacher (the target under ``target_skip``) over
    every position of the texts (prompt and continuation); ``*_before`` is the undistilled
    copy, i.e. the self-drafter with the same layers. KL is the distillation loss (per
    position, nats). ``eval_*`` are on ``eval_texts`` (``None`` without them).
    """

    out_dir: str
    num_layers: int
    keep_layers: list[int]
    skip_layers: list[int]
    target_skip: list[int]
    texts: int
    tokens: int
    candidates: list[CandidateRecord]
    target_latency_ms: float
    drafter_latency_ms: float  # the saved standalone drafter, one token on a cache
    latency_ratio: float
    predicted_speedup: float
    agreement_before: float
    agreement_after: float
    kl_before: float
    kl_after: float
    eval_agreement_before: float | None
    eval_agreement_after: float | None
    steps: int
    loss_curve: list[float]
    search_s: float
    distill_s: float
    total_s: float
    drafter_config: dict[str, Any]
    probe: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _probe(
    loaded: LoadedModel, student: Any, skip: list[int], prompts: Sequence[Sequence[int]], settings: T2DSettings
) -> list[dict[str, Any]]:
    """Speculative greedy decoding of each probe prompt with the self-drafter and the T2D
    drafter (same layers), under ``target_skip``; outputs checked against plain decoding."""
    from tss_opt.decoding import TargetModel
    from tss_opt.decoding.drafters.draft_model import DraftModelDrafter, SelfDrafter
    from tss_opt.decoding.engine import SpeculativeEngine
    from tss_opt.decoding.lossless import check_lossless

    target = TargetModel(loaded.model, layers_path=loaded.config.layers_path, max_context=loaded.config.max_context)
    eos = loaded.eos_token_ids
    rows = []
    for i, ids in enumerate(prompts):
        p = torch.tensor(list(ids), dtype=torch.long)
        kw = dict(max_new_tokens=settings.probe_new_tokens, skip=settings.target_skip)
        plain = SpeculativeEngine(target, None, eos_token_ids=eos).generate(p, **kw)
        row: dict[str, Any] = {"prompt": i, "plain_tokens_per_s": plain.stats.tokens_per_s}
        for name, drafter in (
            ("self", SelfDrafter(loaded.model, skip=skip, num_tokens=settings.draft_tokens,
                                 layers_path=loaded.config.layers_path)),
            ("t2d", DraftModelDrafter(student, num_tokens=settings.draft_tokens)),
        ):
            got = SpeculativeEngine(target, drafter, eos_token_ids=eos).generate(p, **kw)
            row[f"{name}_accept_length"] = got.stats.accept_length
            row[f"{name}_tokens_per_s"] = got.stats.tokens_per_s
            # The one lossless rule (tss_opt.decoding.lossless): equal tokens, or in half
            # precision a first divergence at a near-tie of the plain run.
            check = check_lossless(target, p, plain.tokens.tolist(), got.tokens.tolist(), settings.target_skip)
            row[f"{name}_lossless"] = check.lossless
            if check.divergence is not None:
                row[f"{name}_divergence"] = check.divergence.to_dict()
        rows.append(row)
    return rows


def train_t2d(
    target_loaded: LoadedModel,
    texts: Sequence[str] | Sequence[Sequence[int]],
    settings: T2DSettings,
    out_dir: Path,
    *,
    progress: bool = True,
    probe_prompts: Sequence[Sequence[int]] | None = None,
    eval_texts: Sequence[str] | Sequence[Sequence[int]] | None = None,
    step_callback: Callable[[int, float], None] | None = None,
) -> T2DReport:
    """Build a T2D drafter from ``target_loaded``: search a keep set, distill it, save it.

    Args:
        target_loaded: the target (any source; a GGUF target is plain float32 already).
        texts: training text: strings (tokenized without special tokens) or token-id lists,
            e.g. the domain's chat-formatted calibration prompts (``format_prompt``).
        settings: the knobs (:class:`T2DSettings`).
        out_dir: where the drafter goes (``storage/drafters/<domain>/t2d`` from the CLI);
            holds the model, tokenizer, ``drafter.yaml`` (the ``drafter=draft_model``
            config), ``t2d_state.json`` and ``t2d_report.json``.
        progress: log each trial and checkpoint at INFO (else DEBUG).
        probe_prompts: prompt ids (each ``(P,)``) decoded greedily with the self-drafter and
            the T2D drafter to compare accepted lengths (and check losslessness).
        eval_texts: texts not trained on, for held-out agreement before/after distillation.
        step_callback: called as ``(step, loss)`` after each distillation step.

    Raises:
        T2DError: no usable text, a layer range that does not fit the target, a zero budget.
    """
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    model, layers_path = target_loaded.model, target_loaded.config.layers_path
    L = target_loaded.num_layers
    settings.layer_range(L)  # fail before any work
    train = prepare_texts(target_loaded, texts, settings)
    held = prepare_texts(target_loaded, eval_texts, settings, "evaluation text") if eval_texts else []
    keep, candidates, _ = search_keep_set(target_loaded, train, settings, progress=progress)
    skip = [i for i in range(L) if i not in keep]
    search_s = time.perf_counter() - t_start

    t_distill = time.perf_counter()
    student = build_student(model, keep, layers_path)
    agreement_before, kl_before = score(student, train)
    eval_before = score(student, held)[0] if held else None
    snippet = drafter_snippet(out_dir, target_loaded, len(keep), settings.draft_tokens)
    dtype = next(model.parameters()).dtype

    def save(step: int, losses: list[float]) -> None:
        state = {"step": step, "keep_layers": keep, "skip_layers": skip, "loss_curve": losses,
                 "target": target_loaded.model_id, "settings": asdict(settings)}
        save_checkpoint(student, target_loaded.tokenizer, out_dir, state, dtype)

    import yaml

    save(0, [])  # the undistilled copy: the folder is a loadable drafter from here on
    write_atomic(out_dir / DRAFTER_FILE, "# drafter=draft_model config of this T2D drafter\n"
                  + yaml.safe_dump({"drafter": snippet}, sort_keys=False))
    losses = distill(student, train, settings, save, progress=progress, step_callback=step_callback)
    agreement_after, kl_after = score(student, train)
    eval_after = score(student, held)[0] if held else None
    distill_s = time.perf_counter() - t_distill

    context = train[0].ids[: settings.latency_context]
    drafter_s = decode_latency(student, context, (), settings.latency_reps)
    target_s = decode_latency(model, context, (), settings.latency_reps, layers_path)  # same moment
    probe = _probe(target_loaded, student, skip, probe_prompts, settings) if probe_prompts else None
    best = next(c for c in candidates if c.keep == keep)
    report = T2DReport(
        out_dir=str(out_dir), num_layers=L, keep_layers=keep, skip_layers=skip,
        target_skip=list(settings.target_skip), texts=len(train), tokens=sum(int(t.ids.numel()) for t in train),
        candidates=candidates, target_latency_ms=target_s * 1e3, drafter_latency_ms=drafter_s * 1e3,
        latency_ratio=drafter_s / target_s, predicted_speedup=best.speedup,
        agreement_before=agreement_before, agreement_after=agreement_after,
        kl_before=kl_before, kl_after=kl_after,
        eval_agreement_before=eval_before, eval_agreement_after=eval_after,
        steps=len(losses), loss_curve=losses, search_s=search_s, distill_s=distill_s,
        total_s=time.perf_counter() - t_start, drafter_config=snippet, probe=probe,
    )
    write_atomic(out_dir / REPORT_FILE, json.dumps(report.to_dict(), indent=1))
    (log.info if progress else log.debug)(
        "t2d: kept %s of %d layers; agreement %.3f -> %.3f; latency %.2fx the target; saved %s",
        keep, L, agreement_before, agreement_after, report.latency_ratio, out_dir,
    )
    return report

