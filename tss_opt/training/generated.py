"""Data-free distillation text: text the target generates itself.

A head trained only on a domain's calibration prompts memorises them (token accuracy
0.97-0.99, held-out accepted length below prompt lookup's). Medusa-2 and EAGLE train on the
target's own outputs instead of a fixed corpus ("self-distillation"): here the target *samples*
continuations (temperature ``train.sample_temperature``, seeded) of

- every training prompt of the chosen domains (:class:`~tss_opt.training.domain_text.DomainText`:
  calibration prompts and ``train_data`` records; never a validation or held-out prompt), and
- the shipped generic chat prompts (``tss_opt/data/train/chat_prompts.jsonl``,
  ``train.chat_prompts``),

round after round over the prompts (a new seed each round, so a prompt gets different
continuations) until about ``train.generated_tokens`` tokens were sampled. Sampling rather than
greedy decoding is what makes the text varied: many continuations of one prompt, in the
target's own distribution. The features and greedy labels are then the dense target's on the
sampled text (one forward per batch), so the head still learns the target's greedy
distribution, on contexts it will meet.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.evaluation.domains import Example, format_prompt
from tss_opt.training.common import left_padded
from tss_opt.training.domain_text import DomainText

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tss_opt.config.train import TrainSettings
    from tss_opt.decoding.target import TargetModel

__all__ = [
    "CHAT_PROMPTS",
    "GenerationPrompt",
    "chat_examples",
    "generated_part",
    "generation_prompts",
    "sampled_continuations",
]

log = logging.getLogger("tss_opt.training")
CHAT_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "train" / "chat_prompts.jsonl"
GENERATED = "generated"  # the name of this part in TrainingText.counts and the cache


@dataclass(frozen=True)
class GenerationPrompt:
    """A prompt the target continues: where it comes from and its formatted token ids.

    Attributes:
        source: ``<domain>/calibration``, ``<domain>/extra`` or ``chat``.
        id: the example's id.
        ids: ``torch.LongTensor`` of shape ``(P,)``, chat-formatted as the evaluator formats it.
    """

    source: str
    id: str
    ids: torch.Tensor


def chat_examples(path: str | Path = CHAT_PROMPTS) -> list[Example]:
    """The generic chat prompts (``{"id", "prompt"}`` records, one a line)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append(Example(id=str(rec["id"]), prompt=str(rec["prompt"]), references=(), fields=rec))
    return out


def generation_prompts(
    texts: Sequence[DomainText], tokenizer: PreTrainedTokenizerBase, chat: bool = True
) -> list[GenerationPrompt]:
    """Every prompt the target will continue, formatted with its domain's system prompt.

    Only :class:`DomainText` examples are read (calibration and extra records: never a
    validation or held-out prompt), plus the chat prompts (no system prompt) when ``chat``.
    """
    out = []
    for dt in texts:
        system = dt.domain.config.system_prompt
        for part, examples in (("calibration", dt.calibration), ("extra", dt.extra)):
            out += [GenerationPrompt(f"{dt.domain.name}/{part}", ex.id, format_prompt(tokenizer, ex, system)) for ex in examples]
    if chat:
        out += [GenerationPrompt("chat", ex.id, format_prompt(tokenizer, ex, None)) for ex in chat_examples()]
    return out


@torch.inference_mode()
def sampled_continuations(
    model: Any,
    prompts: Sequence[torch.Tensor],
    total_tokens: int,
    sample_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int = 8,
    eos_token_ids: Sequence[int] = (),
    pad_token_id: int | None = None,
) -> list[tuple[int, torch.Tensor]]:
    """Sample continuations, round after round over the prompts, until ``total_tokens``.

    Each round visits the prompts in a seeded random order, in batches of ``batch_size``
    (left-padded); each batch is sampled under its own seed (``seed``, round, batch) with the
    global RNG restored afterwards, so the result depends only on the arguments.

    Args:
        model: a transformers causal LM (the dense target).
        prompts: ``torch.LongTensor`` of shape ``(P_i,)`` each.
        total_tokens: stop after the batch that reaches this many sampled tokens.
        sample_tokens: tokens per continuation (fewer when EOS comes first; EOS is kept).
        temperature: sampling temperature (> 0); no top-k / top-p truncation.

    Returns:
        ``(prompt index, continuation)`` pairs, the continuation a ``torch.LongTensor`` of
        shape ``(n,)``, ``1 <= n <= sample_tokens``, on the CPU, in generation order.
    """
    if not prompts or total_tokens < 1:
        return []
    eos = [int(t) for t in eos_token_ids]
    pad = int(pad_token_id if pad_token_id is not None else (eos[0] if eos else 0))
    device = next(model.parameters()).device
    out: list[tuple[int, torch.Tensor]] = []
    done = 0
    rounds = 0
    while done < total_tokens:
        order = list(range(len(prompts)))
        random.Random(f"{seed}/{rounds}").shuffle(order)
        for b in range(0, len(order), batch_size):
            batch = order[b : b + batch_size]
            ids, mask = left_padded([prompts[i] for i in batch], pad)
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed((seed * 1_000_003 + rounds * 10_007 + b) % (2**31))
                gen = model.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=sample_tokens,
                    do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0, num_beams=1,
                    pad_token_id=pad, eos_token_id=eos or None,
                )[:, ids.shape[1] :].cpu()  # [b, <= sample_tokens]
            for r, i in enumerate(batch):
                row = gen[r]
                stop = next((j for j, t in enumerate(row.tolist()) if t in eos), None)
                row = row[: stop + 1] if stop is not None else row
                if row.numel():
                    out.append((i, row.clone()))
                    done += int(row.numel())
            if done >= total_tokens:
                break
        rounds += 1
    return out


def _cache_key(model_key: str, prompts: Sequence[GenerationPrompt], settings: TrainSettings) -> str:
    spec = {
        "version": 1,
        "model": model_key,
        "prompts": [[p.source, p.id, p.ids.tolist()] for p in prompts],
        **{k: getattr(settings, k) for k in ("generated_tokens", "sample_tokens", "sample_temperature", "seed", "generation_batch")},
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def generated_part(
    target: TargetModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[DomainText],
    settings: TrainSettings,
    eos_token_ids: Sequence[int] = (),
    cache_dir: str | Path | None = None,
    model_key: str = "",
) -> dict[str, Any] | None:
    """The sampled text with the dense target's features, in the per-domain part format of
    :func:`~tss_opt.training.data.build_training_text` (``sequences``, ``prompt_lengths``,
    ``features``, ``labels``, ``counts``); ``None`` when ``train.generated_tokens`` is 0.

    Sampling runs ``train.generation_batch`` prompts at a time, but at least 8 (batched
    ``generate``: sampled text has no greedy reference the engine could reuse). Cached under
    ``<cache_dir>/generated-<key>.pt``.
    """
    from tss_opt.training.features import extract_features

    if settings.generated_tokens <= 0:
        return None
    prompts = [
        p for p in generation_prompts(texts, tokenizer, settings.chat_prompts)
        if target.fits(int(p.ids.numel()), settings.sample_tokens)
    ]
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{GENERATED}-{_cache_key(model_key, prompts, settings)}.pt"
        if path.is_file():
            log.info("generated text from the cache %s", path)
            return torch.load(path, weights_only=True)
    with target.skip(()):  # the dense target samples
        conts = sampled_continuations(
            target.model, [p.ids for p in prompts], settings.generated_tokens, settings.sample_tokens,
            settings.sample_temperature, settings.seed, max(settings.generation_batch, 8), eos_token_ids,
            getattr(tokenizer, "pad_token_id", None),
        )
    seqs = [torch.cat([prompts[i].ids, c]) for i, c in conts]
    fs = extract_features(target, seqs, progress=settings.progress)
    sizes = [int(q.numel()) for q in seqs]
    sources: dict[str, int] = {}
    for i, _ in conts:
        sources[prompts[i].source] = sources.get(prompts[i].source, 0) + 1
    part = {
        "sequences": seqs,
        "prompt_lengths": [int(prompts[i].ids.numel()) for i, _ in conts],
        "features": list(fs.features.split(sizes)),
        "labels": list(fs.labels.split(sizes)),
        "counts": {"samples": len(conts), "prompts": len({i for i, _ in conts}), "generated": sum(int(c.numel()) for _, c in conts), **{f"from {k}": v for k, v in sources.items()}},
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(part, tmp)
        tmp.replace(path)  # atomic: an interrupted save leaves no half file behind
    return part
