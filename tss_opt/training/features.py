"""The target's features of the training text, computed once, and the rows a head trains on.

EAGLE's pair ``j`` of a sequence ``t[0..n-1]`` is ``(t[j+1], f[j])`` (the next token's
embedding beside the current token's feature); the head's output there should be ``f[j+1]``,
and ``lm_head(f[j+1])`` is the target's distribution of ``t[j+2]``. ``f`` are the target's
final hidden states *after* the final norm (what :meth:`TargetModel.prefill` and
:meth:`TargetModel.verify_forward` give the drafter at run time).

Training pairs are ``j = 0 .. n-2`` of every sequence, concatenated into one stream; the
stream is cut into rows of ``seq_len`` pairs (a row may hold the end of one sequence and the
start of the next; attention never crosses between them). Each epoch shifts the cut by a
random offset, so a pair sees a different amount of left context from epoch to epoch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, VerifyFeedback
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = ["Batch", "FeatureSet", "extract_features", "greedy_features"]


@dataclass
class FeatureSet:
    """Every training token with the target's feature and greedy next token.

    Attributes:
        tokens: ``torch.LongTensor`` of shape ``(N,)``: all sequences concatenated.
        features: ``torch.FloatTensor`` of shape ``(N, H)`` (float32): ``f`` of every token.
        labels: ``torch.LongTensor`` of shape ``(N,)``: ``argmax lm_head(f[i])``, the target's
            greedy token after token ``i``.
        pair_src: ``torch.LongTensor`` of shape ``(M,)``: for training pair ``m``, the global
            index ``i`` of its feature ``f[i]``; its token is ``tokens[i+1]``, its targets
            ``features[i+1]`` and ``labels[i+1]``.
        pair_seq: ``torch.LongTensor`` of shape ``(M,)``: the sequence each pair belongs to.
        pair_pos: ``torch.LongTensor`` of shape ``(M,)``: the pair's position in its sequence.
    """

    tokens: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    pair_src: torch.Tensor
    pair_seq: torch.Tensor
    pair_pos: torch.Tensor

    @classmethod
    def from_sequences(
        cls, sequences: Sequence[torch.Tensor], features: Sequence[torch.Tensor], labels: Sequence[torch.Tensor]
    ) -> FeatureSet:
        """Concatenate per-sequence tokens ``(n_i,)``, features ``(n_i, H)`` and labels
        ``(n_i,)`` and index their pairs (``n_i - 1`` per sequence)."""
        src, seq_id, pos = [], [], []
        start = 0
        for k, s in enumerate(sequences):
            n = int(s.numel())
            if features[k].shape[0] != n or labels[k].shape[0] != n:
                raise ValueError(f"sequence {k}: {n} tokens but {features[k].shape[0]} features, {labels[k].shape[0]} labels")
            n_pairs = max(n - 1, 0)  # pair j needs t[j+1], f[j+1] and its label
            src.append(torch.arange(n_pairs) + start)
            seq_id.append(torch.full((n_pairs,), k, dtype=torch.long))
            pos.append(torch.arange(n_pairs))
            start += n
        return cls(
            tokens=torch.cat([torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]),
            features=torch.cat([f.float() for f in features]),
            labels=torch.cat([torch.as_tensor(lab, dtype=torch.long) for lab in labels]),
            pair_src=torch.cat(src),
            pair_seq=torch.cat(seq_id),
            pair_pos=torch.cat(pos),
        )

    @property
    def num_pairs(self) -> int:
        return int(self.pair_src.numel())

    @property
    def hidden_size(self) -> int:
        return int(self.features.shape[1])

    def rows(self, seq_len: int, offset: int = 0) -> list[tuple[int, int]]:
        """``[start, end)`` pair ranges of the rows, the first cut at ``offset`` (0 <= offset
        < seq_len) so that the cut points move between epochs."""
        m = self.num_pairs
        starts = ([0] if offset > 0 else []) + list(range(offset, m, seq_len))
        ends = starts[1:] + [m]
        return [(s, min(e, s + seq_len)) for s, e in zip(starts, ends) if e > s]

    def batch(self, rows: Sequence[tuple[int, int]], seq_len: int, device: torch.device | str = "cpu") -> Batch:
        """Gather ``rows`` into padded tensors (see :class:`Batch`)."""
        b = len(rows)
        idx = torch.zeros(b, seq_len, dtype=torch.long)
        valid = torch.zeros(b, seq_len, dtype=torch.bool)
        for r, (s, e) in enumerate(rows):
            idx[r, : e - s] = torch.arange(s, e)
            valid[r, : e - s] = True
        src = self.pair_src[idx]  # [B, L]
        seq = torch.where(valid, self.pair_seq[idx], -1 - torch.arange(seq_len).expand(b, -1))
        pos = torch.where(valid, self.pair_pos[idx], 0)
        # A pair may attend to earlier pairs of its own sequence in the row, and to itself
        # (padding too, so that no softmax row is empty).
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        allowed = causal & (seq[:, :, None] == seq[:, None, :])  # [B, L, L]
        return Batch(
            input_ids=self.tokens[src + 1].to(device),
            features=self.features[src].to(device),
            target_features=self.features[src + 1].to(device),
            labels=self.labels[src + 1].to(device),
            position_ids=pos.to(device),
            allowed=allowed.to(device),
            valid=valid.to(device),
        )

    def epochs(self, seq_len: int, batch_size: int, seed: int) -> Iterator[list[tuple[int, int]]]:
        """Row batches forever: each epoch a new random cut offset and a shuffled row order."""
        rng = random.Random(seed)
        while True:
            rows = self.rows(seq_len, rng.randrange(seq_len) if self.num_pairs > seq_len else 0)
            rng.shuffle(rows)
            for i in range(0, len(rows), batch_size):
                yield rows[i : i + batch_size]


@dataclass
class Batch:
    """One optimiser step's rows.

    Attributes:
        input_ids: ``torch.LongTensor`` of shape ``(B, L)``: token ``t[j+1]`` of each pair.
        features: ``torch.FloatTensor`` of shape ``(B, L, H)``: ``f[j]``.
        target_features: ``torch.FloatTensor`` of shape ``(B, L, H)``: ``f[j+1]``.
        labels: ``torch.LongTensor`` of shape ``(B, L)``: the target's greedy ``t[j+2]``.
        position_ids: ``torch.LongTensor`` of shape ``(B, L)``: ``j`` (position in the sequence).
        allowed: ``torch.BoolTensor`` of shape ``(B, L, L)``: query may attend to key.
        valid: ``torch.BoolTensor`` of shape ``(B, L)``: a real pair (not padding).
    """

    input_ids: torch.Tensor
    features: torch.Tensor
    target_features: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    valid: torch.Tensor


@torch.inference_mode()
def extract_features(
    target: TargetModel,
    sequences: Sequence[torch.Tensor],
    tokens_per_batch: int = 4096,
    progress: bool = False,
) -> FeatureSet:
    """Run every sequence through the dense target once; keep features and greedy labels.

    Sequences of similar length are batched (right padding: with causal attention the padding
    cannot change the real positions' features), about ``tokens_per_batch`` tokens a forward.

    Args:
        target: the target; no skip set is applied (the features are the dense target's).
        sequences: ``torch.LongTensor`` of shape ``(n_i,)`` each (``n_i >= 2`` to give a pair).

    Returns:
        A :class:`FeatureSet` with features in float32 on the CPU.
    """
    from tss_opt.progress import progress_bar

    decoder, lm_head, device = target.decoder, target.lm_head, target.device
    seqs = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    feats: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
    labels: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: int(seqs[i].numel()))
    batches: list[list[int]] = []
    for i in order:
        width = int(seqs[i].numel())
        if batches and (len(batches[-1]) + 1) * width <= tokens_per_batch:
            batches[-1].append(i)
        else:
            batches.append([i])
    bar = progress_bar(sum(int(s.numel()) for s in seqs), "target features", unit="token", enabled=progress, leave=False)
    with target.skip(()):  # the dense target, whatever a caller had applied
        for batch in batches:
            width = max(int(seqs[i].numel()) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for r, i in enumerate(batch):
                n = int(seqs[i].numel())
                ids[r, :n], mask[r, :n] = seqs[i], 1
            hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
            for r, i in enumerate(batch):
                h = hidden[r, : int(seqs[i].numel())]  # [n, H]
                feats[i] = h.float().cpu()
                labels[i] = _greedy_labels(lm_head, h)
            bar.update(sum(int(seqs[i].numel()) for i in batch))
    bar.close()
    return FeatureSet.from_sequences(seqs, feats, labels)


def _greedy_labels(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``argmax lm_head(hidden)`` in slices (logits of all rows at once would be rows x vocab)."""
    return torch.cat([lm_head(hidden[k : k + 1024]).argmax(-1).cpu() for k in range(0, hidden.shape[0], 1024)])


class _FeatureRecorder(Drafter):
    """Wraps a drafter and keeps the target's hidden rows of every committed token, as
    :class:`EagleDrafter` does: the prompt's from the prefill, then per step the root's and
    the accepted nodes' rows (every committed token but the newest)."""

    capabilities = DrafterCapabilities(prefill_feedback=True)

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.rows: list[torch.Tensor] = []

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.rows = []
        self.inner.reset(prompt_ids)

    def prefill_feedback(self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        self.rows = [hidden]
        if self.inner.capabilities.prefill_feedback:
            self.inner.prefill_feedback(prompt_ids, logits, hidden)

    def propose(self, context: torch.Tensor) -> DraftTree:
        return self.inner.propose(context)

    def update(self, feedback: VerifyFeedback) -> None:
        self.rows.append(feedback.hidden[[0, *(i + 1 for i in feedback.accepted)]])
        self.inner.update(feedback)


@torch.inference_mode()
def greedy_features(
    target: TargetModel, prompt: torch.Tensor, max_new_tokens: int, eos_token_ids: Sequence[int] = ()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dense target's greedy continuation of ``prompt`` and the features of the whole
    sequence, in one pass: the features are read off the engine's own forwards (prefill and
    verification, as the drafter sees them at run time), so no second forward is needed.

    Decoding drafts with prompt lookup, which is lossless: the continuation is exactly the
    target's greedy one (what the evaluator generates).

    Args:
        prompt: ``torch.LongTensor`` of shape ``(P,)``.
        max_new_tokens: continuation length (fewer when EOS comes first); 0 = prompt only.

    Returns:
        ``(tokens, features, labels)``: ``tokens`` of shape ``(n,)`` = the prompt and the
        continuation without its last token (the newest committed token has no feature yet);
        ``features`` of shape ``(n, H)`` (float32, CPU); ``labels`` of shape ``(n,)``, the
        target's greedy token after each one.
    """
    from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
    from tss_opt.decoding.engine import SpeculativeEngine

    prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(-1).cpu()
    P = int(prompt.numel())
    if max_new_tokens < 1:
        with target.skip(()):
            _, hidden = target.prefill(prompt, target.new_cache())
        return prompt, hidden.float().cpu(), _greedy_labels(target.lm_head, hidden)
    recorder = _FeatureRecorder(PromptLookupDrafter(num_tokens=10))
    out = SpeculativeEngine(target, recorder, eos_token_ids=eos_token_ids).generate(prompt, max_new_tokens=max_new_tokens)
    cont = out.tokens
    n = P + int(cont.numel()) - 1
    hidden = torch.cat(recorder.rows)[:n]  # rows past the budget or EOS are dropped
    tokens = torch.cat([prompt, cont])
    # Labels: the prompt's rows through lm_head (its last one is the first committed token);
    # after the prompt, the next committed token is the greedy one.
    labels = torch.cat([_greedy_labels(target.lm_head, hidden[:P]), cont[1:]])
    return tokens[:n], hidden.float().cpu(), labels
