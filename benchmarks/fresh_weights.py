"""Decoding steps on the weights as the loader leaves them against a fresh copy of them.

    python benchmarks/fresh_weights.py                              # bfloat16 and float32, 64 and 800 cached
    python benchmarks/fresh_weights.py --dtypes bfloat16 --steps 40

``load_model`` copies every CPU parameter into memory of its own once the model is loaded
(``tss_opt/models/loading.py``, :func:`~tss_opt.models.loading.fresh_cpu_weights`). This
measures why, in one process: the embedded model is loaded **without** that copy (the first
model of the process, as a server's or a command's is), then a second target is built on a
deep copy of it (the same values in fresh memory). Plain steps (one token verified) of the two,
eager and compiled, alternate after ``--lengths`` cached tokens; the sum of every parameter
(the step's bandwidth limit) is timed on each copy in the same rounds. Columns: median ms,
ratio loaded / fresh. The copies' logits are checked equal (the values are the same).
One torch thread.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rows_kernel import prefilled  # noqa: E402  (benchmarks/, the script's folder)

from tss_opt.assembly import compose_config, model_settings  # noqa: E402
from tss_opt.decoding.cache import crop_to  # noqa: E402
from tss_opt.decoding.compiled import CompiledTarget  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.decoding.tree import DraftTree  # noqa: E402
from tss_opt.models import loading  # noqa: E402


def _sum_all(params: list[torch.Tensor]) -> None:
    for p in params:
        p.sum()


@torch.inference_mode()
def compare(dtype: str, lengths: list[int], n_steps: int) -> list[str]:
    """Load the model as the loader leaves it, copy it, and time both copies' plain steps."""
    real = loading.fresh_cpu_weights
    loading.fresh_cpu_weights = lambda model: 0  # this load keeps the loader's memory
    try:
        mc = model_settings(compose_config([f"dtype={dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]))
        loaded = loading.load_model(mc).model
    finally:
        loading.fresh_cpu_weights = real
    fresh = copy.deepcopy(loaded)  # the same values, every tensor in memory of its own
    copies = {"loaded": loaded, "fresh": fresh}
    targets: dict[str, Any] = {}
    for name, model in copies.items():
        targets[f"{name}, eager"] = TargetModel(model)
        targets[f"{name}, compiled"] = CompiledTarget(model)
    params = {name: list(model.parameters()) for name, model in copies.items()}
    vocab = int(loaded.config.vocab_size)
    lines = []
    for length in lengths:
        prompt, caches = prefilled(targets, length, vocab)
        arms = [*targets, "loaded, sum", "fresh, sum"]
        times: dict[str, list[float]] = {a: [] for a in arms}
        logits: dict[str, torch.Tensor] = {}
        for i in range(n_steps + 2):  # two warm-up rounds
            for a in arms[i % len(arms):] + arms[: i % len(arms)]:
                t0 = time.perf_counter()
                if a.endswith(", sum"):
                    _sum_all(params[a.split(",")[0]])
                else:
                    logits[a] = targets[a].verify_forward(int(prompt[i % length]), DraftTree.empty(), caches[a], length)[0]
                    crop_to(caches[a], length)
                if i >= 2:
                    times[a].append(time.perf_counter() - t0)
        for mode in ("eager", "compiled"):
            if not torch.equal(logits[f"loaded, {mode}"], logits[f"fresh, {mode}"]):
                raise SystemExit(f"FAIL: {dtype} {mode} logits differ between the loaded weights and their copy")
        med = {a: statistics.median(v) * 1e3 for a, v in times.items()}
        for kind in ("eager", "compiled", "sum"):
            lo, fr = med[f"loaded, {kind}"], med[f"fresh, {kind}"]
            what = "sum of the weights" if kind == "sum" else f"plain step, {kind}"
            lines.append(f"| {dtype} | {length} | {what} | {lo:.1f} | {fr:.1f} | {lo / fr:.2f}x |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--lengths", default="64,800", help="cached tokens before the timed steps")
    ap.add_argument("--steps", type=int, default=30, help="timed rounds per length")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# fresh_weights: SmolLM2-135M, 1 thread, torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; median of {args.steps} rounds, arms alternating\n")
    print("| dtype | cached | what | as loaded ms | fresh copy ms | loaded / fresh |")
    print("|---|---:|---|---:|---:|---:|")
    for dtype in args.dtypes.split(","):
        # One process per precision would be fairer still; here the bfloat16 model is the
        # process's first load, float32 its second (read the bfloat16 rows for the first-load case).
        print("\n".join(compare(dtype, [int(x) for x in args.lengths.split(",")], args.steps)), flush=True)


if __name__ == "__main__":
    main()
