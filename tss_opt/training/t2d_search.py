"""T2D, stage 1: which target layers the drafter keeps (docs/drafters.md, "T2D").

The training text with the teacher's targets (:func:`prepare_texts`), how a candidate is
measured (:func:`score`: top-1 agreement and KL against the teacher; :func:`decode_latency`)
and scored (:func:`speedup_estimate`), and the Optuna study over keep sets
(:func:`search_keep_set`).
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from tss_opt.config.t2d import T2DError, T2DSettings
from tss_opt.decoding.cache import SkipAwareCache, crop_to, with_cache
from tss_opt.decoding.skip import SkipController
from tss_opt.models import LoadedModel

log = logging.getLogger(__name__)

__all__ = [
    "CandidateRecord",
    "TeacherText",
    "decode_latency",
    "kl_loss",
    "prepare_texts",
    "score",
    "search_keep_set",
    "speedup_estimate",
]


@dataclass
class CandidateRecord:
    """One search trial: the keep set, what was measured and the score."""

    trial: int
    keep: list[int]
    agreement: float  # top-1 agreement with the target, fraction of positions
    latency_ms: float  # median per-token drafting latency (skip mechanism on the target)
    latency_ratio: float  # latency_ms / the dense target's per-token latency
    speedup: float  # speedup_estimate(agreement, latency_ratio, draft_tokens)
    kl: float  # KL(target || pruned model) per position, nats
    value: float  # the trial's objective: speedup, or -kl with objective "kl"
    repeated: bool = False  # the keep set was measured by an earlier trial (value reused)



def speedup_estimate(agreement: float, cost_ratio: float, draft_tokens: int) -> float:
    """Expected speedup of chain speculative decoding over plain decoding.

    Leviathan et al. 2023 (Theorem 3.8 / eq. 1) with per-token acceptance ``a`` taken as the
    top-1 agreement, ``g = draft_tokens`` and ``c`` = drafter / target per-token latency:
    ``(1 - a^(g+1)) / ((1 - a) (g c + 1))`` (committed tokens per step over the step's cost in
    target steps; verifying ``g + 1`` tokens is counted as one target step).
    """
    a = min(max(agreement, 0.0), 1.0)
    tokens = draft_tokens + 1.0 if a >= 1.0 else (1.0 - a ** (draft_tokens + 1)) / (1.0 - a)
    return tokens / (draft_tokens * cost_ratio + 1.0)



# ------------------------------------------------------------------------------- data
@dataclass
class TeacherText:
    """One training sequence with its teacher targets.

    Attributes:
        ids: ``torch.LongTensor`` of shape ``(T,)``: the text then the target's continuation.
        top_logp: ``torch.FloatTensor`` of shape ``(T, K)``: the teacher's log-probabilities of
            its ``K`` most likely next tokens at every position, descending.
        top_idx: ``torch.LongTensor`` of shape ``(T, K)``: those tokens (column 0 = argmax).
    """

    ids: torch.Tensor
    top_logp: torch.Tensor
    top_idx: torch.Tensor


def _token_lists(loaded: LoadedModel, texts: Sequence[Any], what: str) -> list[list[int]]:
    out: list[list[int]] = []
    for t in texts:
        if isinstance(t, str):
            ids = loaded.tokenizer(t, add_special_tokens=False)["input_ids"] if t.strip() else []
        else:
            ids = [int(i) for i in (t.tolist() if isinstance(t, torch.Tensor) else t)]
        if len(ids) >= 2:
            out.append(list(ids))
    if not out:
        raise T2DError(
            f"t2d has no {what}: {len(texts)} text(s) given, none with at least 2 tokens. Give the "
            "domain's calibration prompts (a domain with calibration_size >= 1 and non-empty prompts)"
        )
    return out


@torch.no_grad()
def _teacher(loaded: LoadedModel, ids: torch.Tensor, settings: T2DSettings) -> TeacherText:
    """The target's top-k log-probabilities at every position of ``ids`` (shape ``(T,)``)."""
    model = loaded.model
    ctrl = SkipController.for_model(model, loaded.config.layers_path)
    with ctrl.apply(settings.target_skip):
        logits = model(input_ids=ids[None].to(model.device), use_cache=False).logits[0].float()  # [T, V]
    logp = torch.log_softmax(logits, dim=-1)
    k = min(settings.teacher_top_k, logp.shape[-1])
    top_logp, top_idx = logp.topk(k, dim=-1)
    return TeacherText(ids=ids.cpu(), top_logp=top_logp.cpu(), top_idx=top_idx.cpu())


def prepare_texts(
    loaded: LoadedModel, texts: Sequence[Any], settings: T2DSettings, what: str = "training text"
) -> list[TeacherText]:
    """Tokenize (strings) or take (id lists), cut, extend by the target's greedy continuation
    (the target's own outputs are what a drafter must predict), and attach teacher targets."""
    from tss_opt.decoding import TargetModel
    from tss_opt.decoding.engine import SpeculativeEngine

    lists = _token_lists(loaded, texts, what)
    target = TargetModel(loaded.model, layers_path=loaded.config.layers_path, max_context=loaded.config.max_context)
    engine = SpeculativeEngine(target, None, eos_token_ids=loaded.eos_token_ids)
    out = []
    for ids in lists:
        prompt = torch.tensor(ids[-settings.max_tokens_per_text :], dtype=torch.long)
        if settings.continuation_tokens:
            gen = engine.generate(prompt, max_new_tokens=settings.continuation_tokens, skip=settings.target_skip)
            prompt = torch.cat([prompt, gen.tokens.cpu()])
        out.append(_teacher(loaded, prompt, settings))
    return out


# ------------------------------------------------------------------------ measurement
def kl_loss(logits: torch.Tensor, text: TeacherText) -> torch.Tensor:
    """KL(teacher || student) per position, averaged; ``logits``: ``(T, V)`` student logits.

    Over the teacher's top-K tokens plus one bucket for the rest of the vocabulary: a true KL
    of the coarsened distributions (>= 0, <= the full KL; equal to it when K = V).
    """
    logq_all = torch.log_softmax(logits.float(), dim=-1)  # [T, V]
    logq = logq_all.gather(-1, text.top_idx.to(logits.device))  # [T, K]
    p = text.top_logp.to(logits.device).exp()  # [T, K]
    head = (p * (text.top_logp.to(logits.device) - logq)).sum(-1)  # [T]
    # Tail bucket: p_rest * log(p_rest / q_rest); xlogy makes 0 * log 0 = 0 when K = V.
    p_rest = (1.0 - p.sum(-1)).clamp(min=0.0)
    q_rest = (1.0 - logq.exp().sum(-1)).clamp(min=1e-12)
    tail = torch.xlogy(p_rest, p_rest) - p_rest * q_rest.log()
    return (head + tail).mean()


@torch.no_grad()
def score(
    model: Any, texts: Sequence[TeacherText], skip: Iterable[int] = (), layers_path: str = "model.layers"
) -> tuple[float, float]:
    """``(agreement, kl)`` of ``model`` (with ``skip`` bypassed) against the teacher targets:
    top-1 agreement as a fraction of all positions, KL averaged per position."""
    skip = frozenset(skip)
    ctx = SkipController.for_model(model, layers_path).apply(skip) if skip else nullcontext()
    hits = total = 0
    kl = 0.0
    with ctx:
        for t in texts:
            logits = model(input_ids=t.ids[None].to(model.device), use_cache=False).logits[0]  # [T, V]
            hits += int((logits.argmax(-1).cpu() == t.top_idx[:, 0]).sum())
            total += int(t.ids.numel())
            kl += float(kl_loss(logits, t)) * int(t.ids.numel())
    return hits / total, kl / total


@torch.inference_mode()
def decode_latency(
    model: Any, context: torch.Tensor, skip: Iterable[int] = (), reps: int = 7, layers_path: str = "model.layers"
) -> float:
    """Median seconds of one cached one-token forward after ``context`` (``(P,)`` ids), the
    per-token cost of drafting; the cache is cropped back after every timed step."""
    skip = frozenset(skip)
    ctx = SkipController.for_model(model, layers_path).apply(skip) if skip else nullcontext()
    cache = SkipAwareCache(config=model.config)
    n = int(context.numel())
    x = context[None].to(model.device)
    tok = x[:, -1:]
    pos = torch.tensor([[n]], device=model.device)
    times = []
    with ctx:
        model(input_ids=x, **with_cache(cache), use_cache=True, logits_to_keep=1)
        for r in range(reps + 1):
            t0 = time.perf_counter()
            model(input_ids=tok, position_ids=pos, **with_cache(cache), use_cache=True, logits_to_keep=1)
            dt = time.perf_counter() - t0
            crop_to(cache, n)
            if r:  # the first step warms up
                times.append(dt)
    return statistics.median(times)


# ------------------------------------------------------------------------------ search
def _keep_from_params(params: Mapping[str, Any], num_layers: int, lo: int, pinned: list[int]) -> list[int]:
    """The keep set a trial's parameters encode: the pinned layers plus the free layers of
    highest priority (``p<i>`` in [0, 1]; ties to the lower index), ``num_layers`` in all."""
    n = int(params.get("num_layers", lo))
    free = sorted((i for i in range(num_layers) if i not in pinned), key=lambda i: (-float(params[f"p{i:03d}"]), i))
    return sorted(pinned + free[: n - len(pinned)])


def _seed_params(keep: Sequence[int], num_layers: int, pinned: list[int], ranged: bool) -> dict[str, Any]:
    out: dict[str, Any] = {f"p{i:03d}": (1.0 if i in keep else 0.0) for i in range(num_layers) if i not in pinned}
    if ranged:
        out["num_layers"] = len(keep)
    return out


def _seeds(lo: int, hi: int, num_layers: int) -> list[list[int]]:
    """The keep sets tried first, at the smallest then the largest count: the layers spread
    evenly, then the first half and the last half (on SmolLM2 the late layers matter most:
    keeping 10 of 30, the first 4 and last 6 gave KL 5.6 nats, the first 9 and the last 13.5)."""
    out: list[list[int]] = []
    for n in sorted({lo, hi}):
        split = sorted(set(range(n // 2)) | set(range(num_layers - (n - n // 2), num_layers)))
        for keep in (_spread(n, num_layers), split):
            if keep not in out:
                out.append(keep)
    return out


def _spread(n: int, num_layers: int) -> list[int]:
    """``n`` layers evenly spread from the first to the last (distinct: spacing >= 1)."""
    if n == 1:
        return [num_layers - 1]
    return sorted({round(j * (num_layers - 1) / (n - 1)) for j in range(n)})


def search_keep_set(
    loaded: LoadedModel, texts: Sequence[TeacherText], settings: T2DSettings, *, progress: bool = True
) -> tuple[list[int], list[CandidateRecord], float]:
    """Search which target layers the drafter keeps (an Optuna study, maximize the speedup
    estimate). Returns ``(best keep set, one record per trial, dense target latency in s)``.

    The space: ``num_layers`` in the layer range (fixed when the range is one value) and a
    priority ``p<i>`` in [0, 1] per free layer; a trial keeps the pinned layers plus the free
    ones of highest priority, so every trial has exactly ``num_layers`` layers. The
    :func:`_seeds` are enqueued first. A keep set met again reuses its measurement (recorded
    as ``repeated``). Each new candidate's latency is measured right after the dense target's,
    and the ratio of the two is scored, so that load changes on a shared machine cancel out.
    Returns the median of those dense target latencies.
    """
    import optuna

    model, layers_path = loaded.model, loaded.config.layers_path
    L = loaded.num_layers
    lo, hi = settings.layer_range(L)
    pinned = sorted({0, L - 1}) if settings.keep_first_last else []
    ranged = lo < hi
    context = texts[0].ids[: settings.latency_context]
    measured: dict[tuple[int, ...], tuple[float, float, float, float]] = {}
    records: list[CandidateRecord] = []

    def objective(trial: optuna.Trial) -> float:
        params: dict[str, Any] = {}
        if ranged:
            params["num_layers"] = trial.suggest_int("num_layers", lo, hi)
        for i in range(L):
            if i not in pinned:
                params[f"p{i:03d}"] = trial.suggest_float(f"p{i:03d}", 0.0, 1.0)
        keep = _keep_from_params(params, L, lo, pinned)
        key = tuple(keep)
        repeated = key in measured
        skip = [i for i in range(L) if i not in keep]
        if not repeated:
            agreement, kl = score(model, texts, skip, layers_path)
            target_s = decode_latency(model, context, (), settings.latency_reps, layers_path)
            latency = decode_latency(model, context, skip, settings.latency_reps, layers_path)
            measured[key] = (agreement, kl, latency, latency / target_s)
        agreement, kl, latency, ratio = measured[key]
        speedup = speedup_estimate(agreement, ratio, settings.draft_tokens)
        value = speedup if settings.objective == "speedup" else -kl
        records.append(CandidateRecord(trial.number, keep, agreement, latency * 1e3, ratio, speedup, kl, value, repeated))
        for k, v in (("keep", keep), ("agreement", agreement), ("kl", kl), ("latency_ms", latency * 1e3),
                     ("latency_ratio", ratio), ("speedup", speedup), ("repeated", repeated)):
            trial.set_user_attr(k, v)
        (log.info if progress else log.debug)(
            "t2d trial %d: keep %s agreement %.3f kl %.3f latency %.2f ms (%.2fx target) speedup %.3f%s",
            trial.number, keep, agreement, kl, latency * 1e3, ratio, speedup, " (repeated)" if repeated else "",
        )
        return value

    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=min(10, settings.trials))
        if settings.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=settings.seed)
    )
    storage: Any = None
    if settings.storage:
        from tss_opt.storage import open_storage

        storage = open_storage(settings.storage, heartbeat_interval=None, grace_period=None)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, storage=storage, study_name=settings.study_name, load_if_exists=True
    )
    with warnings.catch_warnings():  # "experimental" since Optuna 3.2; nothing to act on
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["predicted_speedup" if settings.objective == "speedup" else "minus_kl"])
    for keep in _seeds(lo, hi, L):
        study.enqueue_trial(_seed_params(keep, L, pinned, ranged))
    study.optimize(
        objective,
        n_trials=settings.trials,
        timeout=settings.search_minutes * 60 if settings.search_minutes else None,
        catch=(),
    )
    best = max(records, key=lambda r: (r.value, -len(r.keep)))
    target_ms = statistics.median(r.latency_ms / r.latency_ratio for r in records if not r.repeated)
    return best.keep, records, target_ms / 1e3

