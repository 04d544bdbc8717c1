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

if TYPE_CHECKING:
    from tss_opt.evaluation.decoding.target import TargetModel

__all__ = ["Batch", "FeatureSet", "extract_features"]


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
    from tqdm.auto import tqdm

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
    bar = tqdm(total=sum(int(s.numel()) for s in seqs), desc="target features", disable=not progress, leave=False)
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
                # Greedy labels in slices: logits of a whole batch would be tokens x vocab.
                labels[i] = torch.cat([lm_head(h[k : k + 1024]).argmax(-1).cpu() for k in range(0, h.shape[0], 1024)])
            bar.update(sum(int(seqs[i].numel()) for i in batch))
    bar.close()
    starts = [0]
    for s in seqs:
        starts.append(starts[-1] + int(s.numel()))
    src, seq_id, pos = [], [], []
    for k, s in enumerate(seqs):
        n_pairs = max(int(s.numel()) - 1, 0)  # pair j needs t[j+1], f[j+1] and its label
        src.append(torch.arange(n_pairs) + starts[k])
        seq_id.append(torch.full((n_pairs,), k, dtype=torch.long))
        pos.append(torch.arange(n_pairs))
    return FeatureSet(
        tokens=torch.cat(seqs),
        features=torch.cat(feats),
        labels=torch.cat(labels),
        pair_src=torch.cat(src),
        pair_seq=torch.cat(seq_id),
        pair_pos=torch.cat(pos),
    )
