"""One target forward over many requests' tokens: the model runner of continuous batching.

Each row (a request) brings the tokens of its step (its whole prompt when it joins, else the
root and its draft tree) and a KV cache of its own (:class:`SkipAwareCache`, as a request
decoded alone). The rows' tokens are flattened into one sequence ``[1, T]``, as vLLM and
transformers' continuous batching do, so that every linear layer (projections, MLP, the
output head) runs once for the whole batch: on a GPU, and on a CPU for small rows, a forward
of ``T`` tokens costs about what one of a single token costs, since it reads the weights once.

Only attention is per row: each row attends to its own cache with its own mask (causal for a
prompt, the tree mask of :meth:`TargetModel.tree_mask` for a step), through the attention a
request decoded alone runs (:func:`~tss_opt.decoding.attention.attend`: transformers' SDPA, or
its float32 math for a step's few positions in half precision on a CPU). It plugs in through
transformers' public extension points: an attention function registered with ``AttentionInterface`` (selected for the forward by
:func:`ragged_attention`) and a cache object whose ``update`` writes each row's keys into
that row's cache. Per-row skip sets go through the project's one skip mechanism
(:meth:`SkipController.apply_ragged`): a layer runs on the tokens of the rows that do not
skip it only.

Why not transformers' ``ContinuousBatchingManager``: it owns the generation loop (one sampled
token per row and step, no tree verification, no per-row attention masks) and its paged
cache's metadata is built for every layer of the batch at once; per-row layer subsets would
have to re-slice that private metadata at every layer (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface

from tss_opt.decoding.attention import attend, attention_selected
from tss_opt.decoding.cache import SkipAwareCache, with_cache
from tss_opt.decoding.host_syncs import upload
from tss_opt.decoding.linear import packed_linears
from tss_opt.decoding.skip import RaggedPlan
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree

__all__ = ["ATTENTION_NAME", "RaggedRow", "RowOutput", "ragged_attention", "ragged_forward"]

ATTENTION_NAME = "tss_ragged"
_KWARG = "tss_ragged"  # the keyword the forward carries down to the cache and the attention


@dataclass
class RaggedRow:
    """One row of a ragged forward.

    Attributes:
        cache: the row's own KV cache (grows by the row's tokens at every layer it runs).
        skip: the layers this row bypasses in this forward.
        prompt: ``torch.LongTensor`` of shape ``(P,)`` when the row joins (its prefill; a
            causal forward on an empty cache), else ``None``.
        root: the last committed token (a step): verified with ``tree`` below it.
        tree: the draft tree of a step.
        prefix_len: the step's cached length (layers that ran).
    """

    cache: SkipAwareCache
    skip: frozenset[int]
    prompt: torch.Tensor | None = None
    root: int = -1
    tree: DraftTree | None = None
    prefix_len: int = 0

    @property
    def length(self) -> int:
        """Tokens this row adds to the forward."""
        if self.prompt is not None:
            return int(self.prompt.numel())
        return 1 + (len(self.tree) if self.tree is not None else 0)


@dataclass
class RowOutput:
    """What one row gets back.

    Attributes:
        logits: a prompt: ``(1, vocab)`` at its last position; a step: ``(n + 1, vocab)``,
            rows ``[root, node_0, ...]`` (as ``TargetModel.verify_forward``).
        hidden: ``(length, hidden)``: the final normed hidden states of the row's tokens.
        executed: decoder-layer forwards that ran on this row's tokens.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    executed: int


class _RaggedCache:
    """The forward's cache: ``update`` splits the new keys by row (the rows running the
    current layer, :attr:`RaggedPlan.active`) and appends them to each row's own cache."""

    def __init__(self, rows: Sequence[RaggedRow], plan: RaggedPlan) -> None:
        self.rows = rows
        self.plan = plan
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(rows)
        self.masks: list[torch.Tensor | None] = [None] * len(rows)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each running row's slice of ``key``/``value`` (``[1, H_kv, T_sub, D]``) to
        its cache; the attention reads the rows' full keys from :attr:`kv`."""
        off = 0
        for r in self.plan.active:
            n = self.plan.lengths[r]
            self.kv[r] = self.rows[r].cache.update(key[:, :, off : off + n], value[:, :, off : off + n], layer_idx)
            off += n
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:  # asked only when positions are not given
        return 0


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Each running row's queries against its own cache (:func:`~tss_opt.decoding.attention.attend`,
    the same call a request decoded alone makes).

    Args:
        query: ``[1, H, T_sub, D]``: the running rows' tokens, row after row.

    Returns:
        ``[1, T_sub, H, D]`` and no weights (transformers' attention contract).
    """
    cache: _RaggedCache = kwargs[_KWARG]
    plan = cache.plan
    outs, off = [], 0
    for r in plan.active:
        n = plan.lengths[r]
        k, v = cache.kv[r]  # type: ignore[misc]
        out, _ = attend(module, query[:, :, off : off + n], k, v, cache.masks[r], dropout=dropout, scaling=scaling)
        outs.append(out)
        off += n
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), None


AttentionInterface.register(ATTENTION_NAME, _attention)


@contextmanager
def ragged_attention(model: Any) -> Iterator[None]:
    """Select the ragged attention for the forwards in the body; the model's own
    implementation returns on exit, always."""
    with attention_selected(model, ATTENTION_NAME):
        yield


@torch.inference_mode()
def ragged_forward(target: TargetModel, rows: Sequence[RaggedRow]) -> list[RowOutput]:
    """One forward of the target over every row's tokens, each row on its own skip set.

    A prompt row runs causally from an empty cache (positions ``0..P-1``); a step row runs
    ``[root] + tree`` at positions ``prefix_len + depth`` under the tree mask. Each row's
    cache grows at the layers it ran, exactly as in a forward of that row alone.

    Returns:
        One :class:`RowOutput` per row, in order.
    """
    device = target.device
    plan = RaggedPlan([r.skip for r in rows], [r.length for r in rows], target.num_layers, device)
    cache = _RaggedCache(rows, plan)
    ids, pos = [], []
    for i, row in enumerate(rows):
        if row.prompt is not None:
            ids.append(row.prompt.reshape(-1))
            pos.append(torch.arange(row.length, dtype=torch.long))
            # None: SDPA's causal path, what the model's own prefill runs on an empty cache.
            cache.masks[i] = None
        else:
            tree = row.tree if row.tree is not None else DraftTree.empty()
            ids.append(torch.tensor([row.root], dtype=torch.long))
            pos.append(torch.tensor([row.prefix_len], dtype=torch.long))
            if len(tree):
                ids.append(tree.tokens.reshape(-1).cpu())
                pos.append(row.prefix_len + torch.tensor(tree.depth, dtype=torch.long))
            cache.masks[i] = target.tree_mask(tree, row.prefix_len)
    # ids and positions built on the host, uploaded together (one copy, no stream sync).
    both = upload(torch.stack([torch.cat(ids), torch.cat(pos)]), device)  # [2, T]
    with target.skipper.apply_ragged(plan), ragged_attention(target.model), packed_linears():
        out = target.decoder(
            input_ids=both[0:1], position_ids=both[1:2], **with_cache(cache), use_cache=True, **{_KWARG: cache}
        )
    hidden = out.last_hidden_state[0]  # [T, H]
    # The output head on the positions whose logits are used: a prompt's last, every slot of a step.
    picks = [
        torch.tensor([s + n - 1]) if row.prompt is not None else torch.arange(s, s + n)
        for row, s, n in zip(rows, plan.starts, plan.lengths)
    ]
    sel = torch.cat(picks)
    with packed_linears():  # the rows' few positions: prepacked where it applies (linear.py)
        logits = target.lm_head(hidden.index_select(0, upload(sel, device)))  # [T_sel, V]
    outputs, off = [], 0
    for i, (s, n, p) in enumerate(zip(plan.starts, plan.lengths, picks)):
        k = int(p.numel())
        outputs.append(RowOutput(logits=logits[off : off + k], hidden=hidden[s : s + n], executed=plan.executed[i]))
        off += k
    return outputs
