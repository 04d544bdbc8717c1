"""Verification latency against tree size, measured once per machine, model, dtype and device.

Part 1 of hardware-sized trees (:mod:`tss_opt.decoding.sizing`): one verification
forward (root + ``n`` chain nodes) timed on a warm cache, cached as JSON
(``storage/tree_sizing/latency-<key>.json``) with the measurement's date and its key.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.decoding.kernels import rows
from tss_opt.decoding.linear import packed_kernel
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
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel


DEFAULT_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)
DEFAULT_DIR = Path("storage/tree_sizing")
ENV_DIR = "TSS_TREE_SIZING_DIR"
"""Environment variable naming the cache folder instead of ``./storage/tree_sizing`` (the test
suite points it at a temporary folder, so tiny test models never write into the checkout)."""
SCHEDULE_KEYS: dict[str, str] = {"earlier": "", "blocks": "+stream", "prefetch": "+prefetch", "ahead": "+ahead"}
"""The suffix a latency table's key takes for our rows kernels' schedule (``rows.SCHEDULE``);
``blocks`` keeps ``+stream``, its name while it was the only new schedule."""


def sizing_dir(directory: str | Path | None = None) -> Path:
    """The folder of latency tables, draft costs and acceptance profiles: ``directory`` when
    given, else ``$TSS_TREE_SIZING_DIR``, else ``storage/tree_sizing`` (relative to the
    working directory, like the other storage defaults)."""
    if directory is not None:
        return Path(directory)
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


# ------------------------------------------------------------------------------ latency
@dataclass(frozen=True)
class LatencyTable(MeasuredTable):
    """Seconds of one verification forward (root + ``n`` tree nodes) against ``n``.

    Attributes:
        seconds: ``{n: seconds}``; ``n = 0`` is a plain decoding step (the root alone).
        padded: the target pads a step's slots to buckets (:func:`padded_sizes`): each
            measured size is the largest of its bucket, and ``n`` nodes cost what the
            smallest measured size ``>= n`` costs (not a line between neighbours).
        key, measured_at, load, cpus, prefix_len: the provenance (:class:`MeasuredTable`).
    """

    seconds: Mapping[int, float]
    padded: bool = False

    def __post_init__(self) -> None:
        if 0 not in self.seconds:
            raise TreeSizingError(
                f"latency table has sizes {sorted(self.seconds)} but no 0 (a plain decoding step); measure n=0 too"
            )
        for n, s in self.seconds.items():
            if n < 0 or not s > 0:
                raise TreeSizingError(f"latency table entry n={n}: {s} s; expected n >= 0 and seconds > 0")

    @property
    def sizes(self) -> list[int]:
        return sorted(self.seconds)

    def at(self, n: int) -> float:
        """Latency for ``n`` nodes: measured, else (padded) the bucket's, else linear between
        the neighbouring sizes, else extrapolated from the two largest (verification cost grows
        at most linearly)."""
        if n in self.seconds:
            return float(self.seconds[n])
        sizes = self.sizes
        lo = max((s for s in sizes if s < n), default=None)
        hi = min((s for s in sizes if s > n), default=None)
        if self.padded and hi is not None:
            return float(self.seconds[hi])
        if lo is not None and hi is not None:
            w = (n - lo) / (hi - lo)
            return float(self.seconds[lo] * (1 - w) + self.seconds[hi] * w)
        if len(sizes) == 1:
            return float(self.seconds[sizes[0]])
        a, b = sizes[-2], sizes[-1]
        slope = max(0.0, (self.seconds[b] - self.seconds[a]) / (b - a))
        return float(self.seconds[b] + slope * (n - b))

    def to_dict(self) -> dict[str, Any]:
        out = {**self.provenance(), "seconds": {str(n): s for n, s in sorted(self.seconds.items())}}
        return {**out, "padded": True} if self.padded else out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyTable:
        try:
            secs = {int(n): float(s) for n, s in data["seconds"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TreeSizingError(
                f"latency table needs 'seconds': {{nodes: seconds}}; got {data!r:.200} ({e})"
            ) from e
        return cls(seconds=secs, padded=bool(data.get("padded", False)), **cls.provenance_from(data))


def padded_sizes(sizes: Iterable[int], slot_buckets: Iterable[int]) -> list[int]:
    """The node counts a padded step's table measures: ``0``, the largest count of every slot
    bucket within ``max(sizes)`` (bucket ``b`` verifies the root and ``b - 1`` nodes) and
    ``max(sizes)`` itself (beyond the largest bucket a compiled step runs eagerly).

    >>> padded_sizes((0, 1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 16, 32, 64))
    [0, 1, 3, 7, 15, 31, 63, 64]
    """
    top = max(sizes)
    return sorted({0, top} | {b - 1 for b in slot_buckets if 1 <= b - 1 <= top})


def _cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else the platform's description."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor() or 'cpu'}"


def hardware_key(target: TargetModel, model_name: str | None = None) -> dict[str, str]:
    """(machine, model, dtype, device) of a target: what a latency table is valid for."""
    device = torch.device(target.device)
    if device.type == "cuda":
        machine = torch.cuda.get_device_name(device)
    else:
        machine = f"{_cpu_name()} x{torch.get_num_threads()} threads"
    cfg = target.model.config
    name = model_name or str(getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "model"))
    name = f"{name} L{cfg.num_hidden_layers} H{cfg.hidden_size}"
    if target.compiled:  # a compiled step has its own costs (decoding/compiled.py)
        name += " compiled"
    if target.slot_buckets:  # measured per bucket since 2026-12-05 (padded_sizes): earlier tables are not
        name += " padded"
    if getattr(target, "packed", False):  # so do prepacked bfloat16 products (decoding/linear.py)
        # A compiled target uses them inside its graphs too (since 2026-12-05): a table of the
        # graphs' earlier aten::mm products ("compiled packed") must not size it. Our rows
        # kernel (since 2026-12-06, decoding/kernels/rows.py) prices verification lower than
        # oneDNN's products: " rows", never sized by a oneDNN table nor the reverse. So does our
        # float32 rows kernel (decoding/kernels/rows_f32.py) against MKL's float32 tables. Where
        # oneDNN's AMX product takes the wider products (since 2026-12-07), " rows+amx": its
        # verification of 9-16 rows costs far less than the rows kernel's alone. Our kernels
        # read the weights in a schedule chosen per CPU since 2026-12-07 (decoding/kernels/rows.py):
        # "+stream" (blocks) or "+prefetch", so no table of another schedule (their steps cost up
        # to 1.75x more, or less) sizes them.
        kernel = packed_kernel(target.model)
        kind = kernel if kernel in ("rows", "rows+amx") else "packed"
        if kind != "packed":
            kind += SCHEDULE_KEYS[rows.SCHEDULE]
        name += f" {kind}+graph" if target.compiled else f" {kind}"
    return {"machine": machine, "model": name, "dtype": str(target.dtype).removeprefix("torch."), "device": device.type}


@torch.inference_mode()
def measure_latency(
    target: TargetModel,
    sizes: Iterable[int] = DEFAULT_SIZES,
    *,
    prefix_len: int = 64,
    repeats: int = 5,
    key: Mapping[str, str] | None = None,
) -> LatencyTable:
    """Time one verification forward per tree size on a warm cache of ``prefix_len`` tokens.

    Every size is a chain of ``n`` nodes (the forward's cost depends on the slot count, not on
    the tree's shape); the cache is cropped back after each forward. The median of
    ``repeats`` timings after one warm-up round is kept; sizes are interleaved per round.
    """
    from tss_opt.decoding.cache import crop_to, request_capacity

    load, cpus = host_load()
    sizes = sorted({int(n) for n in sizes} | {0})
    if target.slot_buckets:  # a padded step: one size per bucket, the bucket's largest
        sizes = padded_sizes(sizes, target.slot_buckets)
    vocab = int(target.model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (prefix_len,), generator=gen)
    cache = target.new_cache(capacity=request_capacity(prefix_len, max(sizes) + 1))  # in place, as the engine's
    target.prefill(prompt, cache)
    sync = torch.cuda.synchronize if torch.device(target.device).type == "cuda" else (lambda: None)
    trees = {n: DraftTree.chain(torch.randint(0, vocab, (n,), generator=gen)) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    # Sizes interleaved within each round (not all repeats of one size in a row), so drift of
    # a shared machine hits every size alike; round 0 warms kernels and allocations.
    window = cpu_snapshot()
    for rnd in range(repeats + 1):
        if rnd == 1:  # after the warm-up: compile workers and first allocations are not contention
            window = cpu_snapshot()
        for n in sizes:
            sync()
            t0 = time.perf_counter()
            target.verify_forward(int(prompt[-1]), trees[n], cache, prefix_len)
            sync()
            if rnd:
                times[n].append(time.perf_counter() - t0)
            crop_to(cache, prefix_len)
    seconds = {n: sorted(ts)[len(ts) // 2] for n, ts in times.items()}
    return LatencyTable(seconds=seconds, padded=bool(target.slot_buckets), key=dict(key or hardware_key(target)),
                        measured_at=utc_now(), load=load, cpus=cpus, others=others_cores(window, cpu_snapshot()),
                        prefix_len=prefix_len)


def load_or_measure_latency(
    target: TargetModel,
    directory: str | Path | None = None,
    *,
    sizes: Iterable[int] = DEFAULT_SIZES,
    model_name: str | None = None,
    prefix_len: int = 64,
) -> LatencyTable:
    """The cached table for this (machine, model, dtype, device), measured and saved once
    (SmolLM2-135M, float32, one CPU thread: 10-20 s on this shared 2-core machine; a tiny test
    model: well under a second).

    ``directory``: see :func:`sizing_dir`. ``prefix_len``: the cached context the forwards
    run on (one file per length: a verified node's cost relative to a plain step depends on
    it; measured: 2-5 % after 64 tokens and about 25 % after 800 on one CPU, and 60 %
    after 64 on another, docs/engine.md)."""
    key = hardware_key(target, model_name)
    path = table_path("latency", key, sizing_dir(directory), prefix_len)
    return load_or_measure(
        path, LatencyTable.from_dict, lambda: measure_latency(target, sizes, key=key, prefix_len=prefix_len), key
    )


def load_or_measure_draft_cost(
    target: TargetModel,
    name: str,
    measure: Callable[[], float],
    directory: str | Path | None = None,
    *,
    model_name: str | None = None,
) -> float:
    """A drafter's measured cost (seconds, e.g. EAGLE's per drafted level), cached like the
    latency table (``draft-<name>-<key>.json``), so that every build on this hardware reads the
    same number and the chosen tree is a deterministic function of cached inputs (the replay
    evaluator and the engine then size alike)."""
    key = hardware_key(target, model_name)
    path = table_path(f"draft-{re.sub(r'[^A-Za-z0-9._]+', '_', name)}", key, sizing_dir(directory))
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            seconds = float(data["seconds"])
            if seconds >= 0:
                return seconds
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass  # damaged: measured again
    seconds = float(measure())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "name": name, "measured_at": utc_now(), "seconds": seconds}, indent=1) + "\n",
                    encoding="utf-8")
    return seconds
