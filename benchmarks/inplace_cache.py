"""The eager plain step with a concatenating KV cache against one that appends in place.

    python benchmarks/inplace_cache.py                        # SmolLM2-135M, float32, one thread
    python benchmarks/inplace_cache.py --lengths 64,770,2000 --steps 40

transformers' cache layers concatenate: every step copies every cached key and value of every
layer (at 770 cached tokens of SmolLM2 in float32, 35 MB a step, beside the 540 MB of weights
it reads). The engines' requests append in place into buffers sized to the request
(``decoding/cache.py``: ``InPlaceLayer``, ``request_capacity``). Per cached length: the median
plain step (one token, no draft, dense, eager: ``TargetModel.verify_forward``) of each, the two
targets' steps alternating so the machine's drift hits both alike, their ratio, and whether
their logits are the same bits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.decoding.cache import crop_to, request_capacity  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.decoding.tree import DraftTree  # noqa: E402


@torch.inference_mode()
def measure(target: TargetModel, length: int, steps: int) -> tuple[float, float, bool]:
    """Median seconds of a plain step after ``length`` cached tokens with a concatenating cache
    and with an in-place one, and whether the two steps' logits are equal bit for bit."""
    vocab = int(target.model.config.vocab_size)
    prompt = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0))
    caches = [target.new_cache(), target.new_cache(capacity=request_capacity(length, steps))]
    for cache in caches:
        target.prefill(prompt, cache)
    empty = DraftTree.empty()
    logits = [target.verify_forward(5, empty, cache, length)[0] for cache in caches]
    for cache in caches:
        crop_to(cache, length)
    times: list[list[float]] = [[], []]
    for _ in range(steps):
        for cache, out in zip(caches, times):
            t0 = time.perf_counter()
            target.verify_forward(5, empty, cache, length)
            out.append(time.perf_counter() - t0)
            crop_to(cache, length)
    return statistics.median(times[0]), statistics.median(times[1]), torch.equal(logits[0], logits[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="64,770,2000")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--cache-dir", default=str(REPO / "storage" / "models"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tss_opt.models import ModelConfig, load_model

    loaded = load_model(ModelConfig(cache_dir=args.cache_dir, dtype=args.dtype))
    target = TargetModel(loaded.model)
    rows = [(n, *measure(target, n, args.steps)) for n in (int(s) for s in args.lengths.split(","))]
    print(f"# eager plain step, concatenating vs in-place cache: {loaded.model_id}, {args.dtype}, {args.threads} "
          f"thread(s), torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("| cached | concatenating ms | in place ms | concatenating / in place | logits |")
    print("|---:|---:|---:|---:|---|")
    for n, cat, inplace, same in rows:
        print(f"| {n} | {cat * 1e3:.1f} | {inplace * 1e3:.1f} | {cat / inplace:.3f}x | {'same bits' if same else 'DIFFER'} |")


if __name__ == "__main__":
    main()
