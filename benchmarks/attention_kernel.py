"""Our attention kernel for a step's few query positions against the float32 math path it replaces.

    python benchmarks/attention_kernel.py                    # SmolLM2's heads (9 / 3 of 64), one thread
    python benchmarks/attention_kernel.py --windows 128,896,2048 --queries 1,4

Per window (cached positions read) and query positions: the median time of
``short_query_attention`` (tss_opt/decoding/attention.py) through our kernel
(``kernels/attention.py``) and through the float32 math path, each eagerly and compiled
(``torch.compile``, the window marked dynamic as in the compiled step; the keys and values are
windows of larger cache buffers, as there), the four arms alternating call by call; beside them
the time to read the window's keys and values once (a sum of each: the bandwidth limit) and
the largest difference of the kernel's output from the math path's, in bfloat16 places.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.decoding import attention  # noqa: E402
from tss_opt.decoding.kernels import attention as kernel  # noqa: E402


def _math(*args: Any) -> torch.Tensor:
    """The float32 math path (the kernel switched off for this call)."""
    on = kernel.available
    kernel.available = lambda: False  # type: ignore[assignment]
    try:
        return attention.short_query_attention(*args)
    finally:
        kernel.available = on  # type: ignore[assignment]


def _read(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The window's keys and values read once (a sum of each)."""
    return k.sum(), v.sum()


def _kernel_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return attention.short_query_attention(q, k, v, m)


def _math_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return attention.short_query_attention(q, k, v, m)  # traced with the kernel switched off


def _compiled(use_kernel: bool) -> Callable[..., torch.Tensor]:
    """``short_query_attention`` compiled with or without the kernel (decided when traced;
    two functions, so dynamo keeps their graphs apart)."""
    compiled = torch.compile(_kernel_fn if use_kernel else _math_fn, fullgraph=True, dynamic=False)
    if use_kernel:
        return compiled

    def without(*args: Any) -> torch.Tensor:
        on = kernel.available
        kernel.available = lambda: False  # type: ignore[assignment]
        try:
            return compiled(*args)
        finally:
            kernel.available = on  # type: ignore[assignment]

    return without


@torch.inference_mode()
def measure(windows: list[int], queries: list[int], heads: int, kv_heads: int, d: int, calls: int) -> list[dict[str, Any]]:
    """One row per (query positions, window): medians in microseconds and the difference."""
    out = []
    for q in queries:
        compiled = {"kernel, compiled": _compiled(True), "math, compiled": _compiled(False)}
        for w in windows:
            g = torch.Generator().manual_seed(w + q)
            query = torch.randn(1, heads, q, d, generator=g).to(torch.bfloat16)
            kbuf = torch.randn(1, kv_heads, w + 512, d, generator=g).to(torch.bfloat16)
            vbuf = torch.randn(1, kv_heads, w + 512, d, generator=g).to(torch.bfloat16)
            key, value = kbuf[:, :, :w], vbuf[:, :, :w]
            mask = torch.zeros(1, 1, q, w, dtype=torch.bfloat16)
            for t in (key, value, kbuf, vbuf):
                torch._dynamo.maybe_mark_dynamic(t, 2)
            torch._dynamo.maybe_mark_dynamic(mask, 3)
            args = (query, key, value, mask)
            arms: dict[str, Callable[..., Any]] = {
                "kernel": attention.short_query_attention, "math": _math, **compiled, "read k, v": _read,
            }
            times: dict[str, list[float]] = {name: [] for name in arms}
            for i in range(calls + 3):
                for name, call in arms.items():
                    t0 = time.perf_counter()
                    call(*args)
                    if i >= 3:  # compiles and warm-up
                        times[name].append(time.perf_counter() - t0)
            got, want = attention.short_query_attention(*args), _math(*args)
            ulp = ((got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-3) * 128).max().item()
            out.append({"q": q, "w": w, "ulp": ulp, **{n: statistics.median(t) * 1e6 for n, t in times.items()}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", default="128,512,896,2048")
    ap.add_argument("--queries", default="1,2,4")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not kernel.available():
        sys.exit(f"the attention kernel cannot run here: {kernel.unavailable_reason()}")
    rows = measure([int(w) for w in args.windows.split(",")], [int(q) for q in args.queries.split(",")],
                   args.heads, args.kv_heads, args.head_dim, args.calls)
    print(f"# attention kernel: {args.heads} query / {args.kv_heads} key-value heads of {args.head_dim}, bfloat16, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}; "
          f"median of {args.calls} calls, arms alternating")
    print("| query positions | window | kernel us | math us | kernel, compiled us | math, compiled us | read k, v us "
          "| math / kernel | compiled: math / kernel | kernel, compiled / read | largest difference (bf16 places) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['q']} | {r['w']} | {r['kernel']:.1f} | {r['math']:.1f} | {r['kernel, compiled']:.1f} | {r['math, compiled']:.1f} "
              f"| {r['read k, v']:.1f} | {r['math'] / r['kernel']:.2f}x | {r['math, compiled'] / r['kernel, compiled']:.2f}x "
              f"| {r['kernel, compiled'] / r['read k, v']:.2f}x | {r['ulp']:.2f} |")


if __name__ == "__main__":
    main()
