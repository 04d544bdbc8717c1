"""How deep rows draft in a batched step, chosen per step from measured costs.

Alone, a request drafts what its drafter chooses (sized per context, ``decoding/sizing/``):
verifying a few more tokens costs little next to reading the weights once. In a batch the
forward already carries one token per row, so every drafted token competes with the other
rows' tokens for the same forward, and on a machine where the forward's cost grows with its
tokens (a CPU, a GPU at large batches) drafting stops paying as the batch grows.

Each step, :class:`DepthPolicy` picks the depth cap ``k`` (the deepest node any row may
draft) that maximizes the batch's expected committed tokens per second::

    tokens(k) = sum_r (1 + m_r * (a_r + a_r^2 + ... + a_r^k))
    seconds(k) = latency(rows, 1 + mean_r(m_r) * k)

where ``m_r`` is row ``r``'s proposal rate (share of its steps with a draft) and ``a_r`` its
per-token acceptance, both from the row's own history shrunk towards a prior while it is
short, and ``latency(rows, tokens per row)`` is a table measured on this machine, model and
dtype (:class:`BatchLatency`, cached like the verification latency tables). ``k = 0`` is
batched plain decoding, which emits the same tokens.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.decoding.sizing.latency import hardware_key, sizing_dir
from tss_opt.decoding.sizing.measured import (
    MeasuredTable,
    TreeSizingError,
    cpu_snapshot,
    host_load,
    load_or_measure,
    others_cores,
    table_path,
    utc_now,
)

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = ["BatchLatency", "DepthPolicy", "RowOdds", "choose_depth", "load_or_measure_batch_latency"]


ROWS = (1, 2, 4, 8, 16, 32)
TOKENS = (1, 2, 3, 5, 9)  # tokens per row: the root plus 0, 1, 2, 4, 8 drafted
MAX_DEPTH = 8
# A row with little history drafts as an average row would: proposal rate and acceptance are
# shrunk towards these with the weight of PRIOR_STEPS steps.
PRIOR_RATE, PRIOR_ACCEPTANCE, PRIOR_STEPS = 0.5, 0.5, 4.0


@dataclass(frozen=True)
class RowOdds:
    """A running row's drafting history.

    Attributes:
        proposal_rate: share of its steps in which the drafter proposed anything.
        acceptance: drafted tokens accepted / proposed (``None``: nothing proposed yet).
        steps: verification steps so far (the weight of the two rates against the prior).
    """

    proposal_rate: float | None = None
    acceptance: float | None = None
    steps: int = 0

    def shrunk(self) -> tuple[float, float]:
        """``(m, a)`` shrunk towards the prior by its weight in steps."""
        w, n = PRIOR_STEPS, float(self.steps)
        m = ((self.proposal_rate or 0.0) * n + PRIOR_RATE * w) / (n + w)
        a = PRIOR_ACCEPTANCE if self.acceptance is None else (self.acceptance * n + PRIOR_ACCEPTANCE * w) / (n + w)
        return m, min(a, 0.999)


@dataclass(frozen=True)
class BatchLatency(MeasuredTable):
    """Seconds of one batched forward against rows and tokens per row, measured.

    Attributes:
        rows: measured batch sizes, increasing.
        tokens: measured tokens per row, increasing (1: plain decoding).
        seconds: ``seconds[i][j]`` for ``rows[i]`` rows of ``tokens[j]`` tokens each.
        key, measured_at, load, cpus, prefix_len: the provenance
            (:class:`~tss_opt.decoding.sizing.measured.MeasuredTable`).
    """

    rows: tuple[int, ...]
    tokens: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.rows or not self.tokens:
            raise TreeSizingError("a batch latency table needs at least one batch size and one token count")
        if list(self.rows) != sorted(set(self.rows)) or list(self.tokens) != sorted(set(self.tokens)):
            raise TreeSizingError(f"batch latency table: rows {self.rows} and tokens {self.tokens} must increase")
        if len(self.seconds) != len(self.rows) or any(len(r) != len(self.tokens) for r in self.seconds):
            raise TreeSizingError("batch latency table: seconds must have one row per batch size, one value per token count")
        if any(not s > 0 for r in self.seconds for s in r):
            raise TreeSizingError("batch latency table: every time must be positive; measure it again")

    def at(self, rows: float, tokens: float) -> float:
        """Seconds for ``rows`` rows of ``tokens`` tokens: bilinear between measured points,
        linear beyond the largest batch and token count (more work, proportionally more time)."""

        def axis(xs: Sequence[int], x: float) -> tuple[int, int, float]:
            if len(xs) == 1:
                return 0, 0, 0.0
            j = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
            return j, j + 1, (x - xs[j]) / (xs[j + 1] - xs[j])  # t > 1 extrapolates

        i0, i1, u = axis(self.rows, max(rows, self.rows[0]))
        j0, j1, v = axis(self.tokens, max(tokens, self.tokens[0]))
        s = self.seconds
        low = s[i0][j0] + (s[i0][j1] - s[i0][j0]) * v
        high = s[i1][j0] + (s[i1][j1] - s[i1][j0]) * v
        return max(low + (high - low) * u, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows), "tokens": list(self.tokens), "seconds": [list(r) for r in self.seconds],
            **self.provenance(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchLatency:
        try:
            return cls(
                rows=tuple(int(x) for x in data["rows"]), tokens=tuple(int(x) for x in data["tokens"]),
                seconds=tuple(tuple(float(x) for x in r) for r in data["seconds"]), **cls.provenance_from(data),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TreeSizingError(f"batch latency table is malformed ({e}); delete it to measure it again") from e


def choose_depth(latency: BatchLatency, rows: int, odds: Sequence[RowOdds], max_depth: int = MAX_DEPTH) -> int:
    """The draft depth cap with the most expected tokens per second (module docstring).

    Args:
        rows: rows in the forward (running and joining).
        odds: the running rows' histories.

    Returns:
        ``k`` in ``[0, max_depth]``; ties go to the smaller ``k`` (less work, same speed).
    """
    if not odds:
        return max_depth
    rates = [o.shrunk() for o in odds]
    mean_m = sum(m for m, _ in rates) / len(rates)
    best_k, best = 0, -1.0
    for k in range(max_depth + 1):
        tokens = sum(1.0 + m * sum(a**i for i in range(1, k + 1)) for m, a in rates)
        speed = tokens / latency.at(rows, 1.0 + mean_m * k)
        if speed > best * (1 + 1e-9):
            best_k, best = k, speed
    return best_k


@dataclass(frozen=True)
class DepthPolicy:
    """Chooses each batched step's depth cap: from a measured table (:func:`choose_depth`),
    or a fixed cap.

    Attributes:
        latency: the machine's batch latency table (``None``: use ``fixed``).
        fixed: a cap for every batched step (``0``: batched plain decoding).
        max_depth: the deepest cap considered (a row's drafter may choose less).
    """

    latency: BatchLatency | None = None
    fixed: int | None = None
    max_depth: int = MAX_DEPTH

    def __post_init__(self) -> None:
        if (self.latency is None) == (self.fixed is None):
            raise ValueError("a depth policy needs either a measured latency table or a fixed cap")
        if self.fixed is not None and self.fixed < 0:
            raise ValueError(f"fixed={self.fixed}; expected a cap >= 0 (0: no drafting in a batch)")

    def choose(self, rows: int, odds: Sequence[RowOdds]) -> int | None:
        """The cap for this step; ``None`` (no cap) for a row alone: it drafts as it would
        alone (its drafter is sized for one row already)."""
        if rows <= 1:
            return None
        if self.fixed is not None:
            return self.fixed
        assert self.latency is not None
        return choose_depth(self.latency, rows, odds, self.max_depth)


# ------------------------------------------------------------------------------ measuring
@torch.inference_mode()
def measure_batch_latency(
    target: TargetModel,
    rows: Iterable[int] = ROWS,
    tokens: Iterable[int] = TOKENS,
    *,
    prefix_len: int = 64,
    repeats: int = 5,
    key: Mapping[str, str] | None = None,
) -> BatchLatency:
    """Time one batched forward per (rows, tokens per row) on warm caches of ``prefix_len``
    tokens (the fastest of ``repeats`` after a warm-up round, points interleaved per round,
    then made monotone in rows and tokens)."""
    from tss_opt.decoding.cache import crop_to
    from tss_opt.decoding.ragged import RaggedRow, ragged_forward
    from tss_opt.decoding.tree import DraftTree

    load, cpus = host_load()
    rows_t, tokens_t = sorted({int(r) for r in rows}), sorted({int(t) for t in tokens})
    vocab = int(target.model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (prefix_len,), generator=gen) for _ in range(max(rows_t))]
    caches = [target.new_cache() for _ in prompts]
    for p, c in zip(prompts, caches):
        target.prefill(p, c)
    trees = {t: DraftTree.chain(torch.randint(0, vocab, (t - 1,), generator=gen)) for t in tokens_t}
    sync = torch.cuda.synchronize if torch.device(target.device).type == "cuda" else (lambda: None)
    times: dict[tuple[int, int], list[float]] = {(r, t): [] for r in rows_t for t in tokens_t}
    window = cpu_snapshot()
    for rnd in range(repeats + 1):  # round 0 warms up
        if rnd == 1:  # the busy check covers the timed rounds only (not compile workers)
            window = cpu_snapshot()
        for r in rows_t:
            for t in tokens_t:
                batch = [
                    RaggedRow(cache=caches[i], skip=frozenset(), root=int(prompts[i][-1]), tree=trees[t], prefix_len=prefix_len)
                    for i in range(r)
                ]
                sync()
                t0 = time.perf_counter()
                ragged_forward(target, batch)
                sync()
                if rnd:
                    times[(r, t)].append(time.perf_counter() - t0)
                for c in caches[:r]:
                    crop_to(c, prefix_len)
    # The fastest of the repeats (noise on a shared machine only ever adds time), then made
    # monotone: more rows or more tokens never take less time (a running maximum along both
    # axes), so one disturbed point cannot make drafting look free or costly.
    grid = [[min(times[(r, t)]) for t in tokens_t] for r in rows_t]
    for i in range(len(rows_t)):
        for j in range(len(tokens_t)):
            grid[i][j] = max(grid[i][j], grid[i - 1][j] if i else 0.0, grid[i][j - 1] if j else 0.0)
    seconds = tuple(tuple(row) for row in grid)
    return BatchLatency(
        rows=tuple(rows_t), tokens=tuple(tokens_t), seconds=seconds, key=dict(key or hardware_key(target)),
        measured_at=utc_now(), load=load, cpus=cpus, others=others_cores(window, cpu_snapshot()),
        prefix_len=prefix_len,
    )


def batch_latency_path(target: TargetModel, directory: str | Path | None = None, model_name: str | None = None) -> Path:
    """Where this machine's table for ``target`` is cached (next to the verification tables)."""
    return table_path("batch-latency", hardware_key(target, model_name), sizing_dir(directory))


def load_or_measure_batch_latency(
    target: TargetModel, directory: str | Path | None = None, *, model_name: str | None = None
) -> BatchLatency:
    """The cached table for this (machine, model, dtype, device), measured and saved once
    (SmolLM2-135M, float32, one CPU thread: about half a minute; the tiny test model: a second)."""
    path = batch_latency_path(target, directory, model_name)
    key = hardware_key(target, model_name)
    return load_or_measure(path, BatchLatency.from_dict, lambda: measure_batch_latency(target, key=key), key)
