"""A domain's training text for drafters: what a head may learn from, and nothing it is
judged on.

The text of a domain is

- its **calibration** prompts (``Domain.split("calibration")``), never its validation or
  held-out prompts;
- its **extra** records (``DomainConfig.train_data``, e.g. more NQ-open questions for qa),
  disjoint from the pool: a record whose prompt equals any prompt of the pool is dropped
  (and counted), so a validation or held-out prompt can never slip in;
- after every prompt, the plain target's **greedy continuation** (``continuation_tokens``):
  the text the drafter will be asked to predict at run time;
- with ``train.generated_tokens > 0``, text the target **samples** itself from these prompts
  and generic chat prompts (data-free distillation, :mod:`~tss_opt.training.generated`).

Every prompt is chat-formatted exactly as the evaluator formats it (``format_prompt``), so the
head sees the token sequences it will draft on. With ``generation_batch: 1`` (the default) each
prompt is decoded by the engine (lossless prompt-lookup drafting) and the target's features are
read off those very forwards (:func:`~tss_opt.training.features.greedy_features`): one pass
per prompt. With a larger batch, continuations come from batched ``generate`` (faster on a
GPU) and the features from a second forward (:func:`~tss_opt.training.features.extract_features`).
Sequences, features and labels are cached per domain (``<cache_dir>/<domain>-<key>.pt``),
keyed by the model, the prompts and the settings: a second run, or the ``general`` head after
the per-domain ones, skips all of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.evaluation.domains import format_prompt
from tss_opt.training.common import TrainingDataError, left_padded
from tss_opt.training.domain_text import DomainText, domain_text
from tss_opt.training.features import FeatureSet, extract_features, greedy_features
from tss_opt.training.generated import GENERATED, generated_part

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tss_opt.config.train import TrainSettings
    from tss_opt.decoding.target import TargetModel

__all__ = [
    "DomainText",
    "TrainingText",
    "build_training_text",
    "domain_text",
    "greedy_continuations",
]

log = logging.getLogger("tss_opt.training")
CACHE_VERSION = 2  # bump when the cached content changes meaning




@dataclass
class TrainingText:
    """Token sequences to train on (each a prompt followed by the target's continuation) and
    the target's features of them.

    Attributes:
        sequences: ``torch.LongTensor`` of shape ``(n_i,)`` each, on the CPU.
        prompt_lengths: prompt tokens at the start of each sequence.
        features: the target's features and greedy labels of every token (float32, CPU).
        counts: what went in, per domain: prompts from calibration / extra, dropped
            records, prompts too long for the model, generated tokens.
    """

    sequences: list[torch.Tensor]
    prompt_lengths: list[int]
    features: FeatureSet
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(int(s.numel()) for s in self.sequences)

    @property
    def num_pairs(self) -> int:
        """Training pairs: a sequence of ``n`` tokens gives ``n - 1`` (pair ``j`` predicts the
        feature of token ``j + 1``)."""
        return sum(max(int(s.numel()) - 1, 0) for s in self.sequences)

    def describe(self) -> str:
        parts = []
        for name, c in self.counts.items():
            if "samples" in c:  # the sampled text (tss_opt.training.generated)
                parts.append(f"{name}: {c['samples']} sampled continuations of {c['prompts']} prompts, {c['generated']} tokens")
                continue
            bits = [f"{c.get('calibration', 0)} calibration + {c.get('extra', 0)} extra prompts"]
            if c.get("dropped"):
                bits.append(f"{c['dropped']} extra dropped (pool prompts)")
            if c.get("too_long"):
                bits.append(f"{c['too_long']} too long")
            bits.append(f"{c.get('generated', 0)} generated tokens")
            parts.append(f"{name}: " + ", ".join(bits))
        return f"{len(self.sequences)} sequences, {self.num_tokens} tokens ({'; '.join(parts)})"


@torch.inference_mode()
def greedy_continuations(
    model: Any,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int,
    batch_size: int = 8,
    eos_token_ids: Sequence[int] = (),
    pad_token_id: int | None = None,
    progress: bool = False,
) -> list[torch.Tensor]:
    """The plain (dense) model's greedy continuation of every prompt, batched.

    Prompts of similar length are batched together (sorted by length), left-padded, and run
    through ``model.generate`` without sampling. Float noise can make a batched continuation
    differ from an unbatched one near a tie; for training text that does not matter.

    Args:
        model: a transformers causal LM.
        prompts: ``torch.LongTensor`` of shape ``(P_i,)`` each.
        max_new_tokens: tokens per prompt (fewer when EOS comes first).
        eos_token_ids: generation of a prompt stops after any of these (kept).
        pad_token_id: the padding id (default: the first EOS id, else 0).

    Returns:
        ``torch.LongTensor`` of shape ``(n_i,)`` per prompt, ``n_i <= max_new_tokens``, in the
        order of ``prompts``, on the CPU.
    """
    eos = [int(t) for t in eos_token_ids]
    pad = int(pad_token_id if pad_token_id is not None else (eos[0] if eos else 0))
    device = next(model.parameters()).device
    out: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(prompts)
    if max_new_tokens < 1:
        return out
    order = sorted(range(len(prompts)), key=lambda i: int(prompts[i].numel()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    bar = _bar(len(prompts), "generating continuations", progress)
    for batch in batches:
        ids, mask = left_padded([prompts[i] for i in batch], pad)
        gen = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad,
            eos_token_id=eos or None,
        )[:, ids.shape[1] :].cpu()  # [b, <= max_new_tokens]
        for r, i in enumerate(batch):
            row = gen[r]
            stop = next((j for j, t in enumerate(row.tolist()) if t in eos), None)
            out[i] = row[: stop + 1] if stop is not None else row
        bar.update(len(batch))
    bar.close()
    return out


def _bar(total: int, desc: str, enabled: bool) -> Any:
    from tss_opt.progress import progress_bar

    return progress_bar(total, desc, unit="prompt", enabled=enabled, leave=False)


def _cache_key(model_key: str, dt: DomainText, settings: TrainSettings, system_prompt: str | None) -> str:
    h = hashlib.sha256()
    spec = {
        "version": CACHE_VERSION,
        "model": model_key,
        "domain": dt.domain.name,
        "system_prompt": system_prompt,
        "continuation_tokens": settings.continuation_tokens,
        "batched": settings.generation_batch > 1,
        "examples": [[e.id, e.prompt] for e in dt.examples],
    }
    h.update(json.dumps(spec, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _domain_sequences(
    target: TargetModel,
    tokenizer: PreTrainedTokenizerBase,
    dt: DomainText,
    settings: TrainSettings,
    eos_token_ids: Sequence[int],
) -> dict[str, Any]:
    """Sequences, features, labels and counts of one domain (what the cache holds)."""
    system = dt.domain.config.system_prompt
    prompts: list[torch.Tensor] = []
    counts = {"calibration": 0, "extra": 0, "dropped": dt.dropped, "too_long": 0, "generated": 0}
    for part, examples in (("calibration", dt.calibration), ("extra", dt.extra)):
        for ex in examples:
            ids = format_prompt(tokenizer, ex, system)
            # The prompt plus its continuation must fit the model's positions.
            if not target.fits(int(ids.numel()), settings.continuation_tokens):
                counts["too_long"] += 1
                continue
            prompts.append(ids)
            counts[part] += 1
    n_new = settings.continuation_tokens
    if settings.generation_batch > 1:
        pad = getattr(tokenizer, "pad_token_id", None)
        conts = greedy_continuations(
            target.model, prompts, n_new, settings.generation_batch, eos_token_ids, pad, progress=settings.progress
        )
        seqs = [torch.cat([p, c]) for p, c in zip(prompts, conts)]
        fs = extract_features(target, seqs, progress=settings.progress)
        feats = list(fs.features.split([int(q.numel()) for q in seqs]))
        labels = list(fs.labels.split([int(q.numel()) for q in seqs]))
    else:
        seqs, feats, labels = [], [], []
        bar = _bar(len(prompts), f"{dt.domain.name}: continuations and features", settings.progress)
        for p in prompts:
            q, f, lab = greedy_features(target, p, n_new, eos_token_ids)
            seqs.append(q)
            feats.append(f)
            labels.append(lab)
            bar.update(1)
        bar.close()
    counts["generated"] = sum(int(q.numel()) - int(p.numel()) for p, q in zip(prompts, seqs))
    return {
        "sequences": seqs,
        "prompt_lengths": [int(p.numel()) for p in prompts],
        "features": feats,
        "labels": labels,
        "counts": counts,
    }


def build_training_text(
    target: TargetModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[DomainText],
    settings: TrainSettings,
    eos_token_ids: Sequence[int] = (),
    cache_dir: str | Path | None = None,
    model_key: str = "",
) -> TrainingText:
    """Format every example, continue it with the plain (dense) target, keep the target's
    features; cached per domain.

    Args:
        target: the target; no skip set is applied (the features are the dense target's).
        texts: one :class:`DomainText` per domain.
        cache_dir: where each domain's result is cached (``None``: no cache).
        model_key: identifies the model in the cache key (e.g. ``model_id_for``).

    Raises:
        TrainingDataError: no sequence fits the model's context.
    """
    sequences: list[torch.Tensor] = []
    lengths: list[int] = []
    feats: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    counts: dict[str, dict[str, int]] = {}
    for dt in texts:
        name = dt.domain.name
        path = None
        if cache_dir is not None:
            key = _cache_key(model_key, dt, settings, dt.domain.config.system_prompt)
            path = Path(cache_dir) / f"{name}-{key}.pt"
        if path is not None and path.is_file():
            part = torch.load(path, weights_only=True)
            log.info("domain %s: %d training sequences from the cache %s", name, len(part["sequences"]), path)
        else:
            t0 = time.perf_counter()
            part = _domain_sequences(target, tokenizer, dt, settings, eos_token_ids)
            log.info(
                "domain %s: %d prompts continued by up to %d tokens, features kept, in %.1f s",
                name, len(part["sequences"]), settings.continuation_tokens, time.perf_counter() - t0,
            )
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                torch.save(part, tmp)
                tmp.replace(path)  # atomic: an interrupted save leaves no half file behind
        sequences += part["sequences"]
        lengths += part["prompt_lengths"]
        feats += part["features"]
        labels += part["labels"]
        counts[name] = part["counts"]
    gen = generated_part(target, tokenizer, texts, settings, eos_token_ids, cache_dir, model_key)
    if gen is not None:  # data-free distillation: the target's sampled text (train.generated_tokens)
        sequences += gen["sequences"]
        lengths += gen["prompt_lengths"]
        feats += gen["features"]
        labels += gen["labels"]
        counts[GENERATED] = gen["counts"]
    if not sequences:
        raise TrainingDataError(
            f"no training sequence fits the model's {target.max_context} positions "
            f"(with train.continuation_tokens={settings.continuation_tokens}); lower "
            "train.continuation_tokens or use a model with a longer context"
        )
    return TrainingText(sequences, lengths, FeatureSet.from_sequences(sequences, feats, labels), counts)
