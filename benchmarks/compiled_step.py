"""The compiled verification step against the eager one and the bandwidth limit.

    python benchmarks/compiled_step.py                        # SmolLM2-135M, float32, one thread
    python benchmarks/compiled_step.py --lengths 64,800 --steps 30 --skip 6,20,25

Per cached length (64 and 800 tokens by default): the median time of a plain step (one
token verified, no draft) eager and compiled (``decoding/compiled.py``), dense and with one
skip set, the compiled step again with every call through dynamo's frame (``direct=False``:
what ``decoding/direct.py`` skips) and with dynamo's every guard (``lean_guards=False``: the
graphs' guard checks, which ``tensor_guards`` trims; the four targets' steps alternate), against the time to read every parameter once (a sum of each, the "weights copy":
the step's bandwidth limit when weights dominate its bytes). Also checks that the compiled
target with prompt lookup decodes the eager target's plain greedy tokens. The machine's load (``os.getloadavg``) is
printed: on the shared development machine quote the medians with it.

Used by the GPU check's section 5 (``gpu_check_compiled.py``) through :func:`measure`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.decoding.cache import crop_to  # noqa: E402
from tss_opt.decoding.compiled import CompiledTarget  # noqa: E402
from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.lossless import check_lossless  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.decoding.tree import DraftTree  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def weights_read_s(model: Any, repeats: int = 7) -> float:
    """Median seconds to read every parameter once (a sum of each): the bandwidth estimate."""
    params = list(model.parameters())
    device = params[0].device
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for p in params:
            p.sum()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def _read_once(params: list[torch.Tensor]) -> None:
    for p in params:
        p.sum()


@torch.inference_mode()
def step_s(
    targets: list[TargetModel], length: int, skip: tuple[int, ...], steps: int, vocab: int, read: bool = False
) -> list[float]:
    """Median seconds of a plain step (root only) of each target on ``length`` cached tokens
    under ``skip`` (scope verify: a dense prefill). The targets' steps alternate, so the
    machine's drift (other processes) hits them alike; each cache is cut back after its step
    so every step sees the same length. ``read``: one more figure, last, the weights read once
    (a sum of every parameter) timed between the steps, so the step and its bandwidth limit
    are measured under the same load."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (length,), generator=g)
    caches = []
    for target in targets:
        caches.append(target.new_cache())
        target.prefill(prompt, caches[-1])
    empty = DraftTree.empty()
    times: list[list[float]] = [[] for _ in range(len(targets) + read)]
    params = list(targets[0].model.parameters())
    device = targets[0].device
    with targets[0].skip(skip):  # one model: one skip controller for all targets
        for i in range(steps + 2):  # two warm-up steps (a compiled graph's first call)
            for target, cache, out in zip(targets, caches, times):
                _sync(target.device)
                t0 = time.perf_counter()
                target.verify_forward(int(prompt[i % length]), empty, cache, length)
                _sync(target.device)
                if i >= 2:
                    out.append(time.perf_counter() - t0)
                crop_to(cache, length)
            if read:
                _sync(device)
                t0 = time.perf_counter()
                _read_once(params)
                _sync(device)
                if i >= 2:
                    times[-1].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def tokens_pair(eager: TargetModel, compiled: TargetModel, prompt: torch.Tensor, n: int, skip: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Greedy tokens of ``prompt`` (``torch.LongTensor`` of shape ``(P,)``): plain decoding of
    the eager target, and the compiled target with prompt lookup (chains of up to 3 drafted
    tokens, so steps of 1 to 4 slots: buckets 1, 2 and 4); equal when lossless."""
    a = SpeculativeEngine(eager).generate(prompt, max_new_tokens=n, skip=skip).tokens
    b = SpeculativeEngine(compiled, PromptLookupDrafter(num_tokens=3)).generate(prompt, max_new_tokens=n, skip=skip).tokens
    return a.tolist(), b.tolist()


def measure(model: Any, lengths: list[int], skips: list[tuple[int, ...]], steps: int, check_tokens: int) -> dict[str, Any]:
    """Every figure of the table: ``rows`` of (length, skip, eager s, compiled s, compiled through
    dynamo s, compiled with every guard s, weights read s), the
    weights-read time, the first compile's time, graphs compiled, and per skip set the
    tokens of :func:`tokens_pair` on ``prompt`` (a random 32-token text said twice)."""
    vocab = int(model.config.vocab_size)
    eager = TargetModel(model)
    t0 = time.perf_counter()
    compiled = CompiledTarget(model)
    step_s([compiled], lengths[0], (), 1, vocab)  # the first compile, timed apart
    compile_s = time.perf_counter() - t0
    through = CompiledTarget(model, direct=False)
    guarded = CompiledTarget(model, lean_guards=False)
    rows = []
    for length in lengths:
        for skip in skips:
            rows.append((length, skip, *step_s([eager, compiled, through, guarded], length, skip, steps, vocab, read=True)))
    prompt = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(1)).repeat(2)
    tokens = {skip: tokens_pair(eager, compiled, prompt, check_tokens, skip) for skip in skips}
    verdicts = {skip: check_lossless(eager, prompt, a, b, skip).verdict for skip, (a, b) in tokens.items()}
    return {"rows": rows, "weights_s": weights_read_s(model), "compile_s": compile_s, "tokens": tokens,
            "verdicts": verdicts, "prompt": prompt, "compilations": compiled.compilations}


def table(res: dict[str, Any], weight_bytes: int) -> list[str]:
    """The figures as Markdown lines."""
    w = res["weights_s"]
    out = [f"weights read once: {w * 1e3:.1f} ms ({weight_bytes / w / 1e9:.1f} GB/s over {weight_bytes / 1e6:.0f} MB; "
           "median of 7 at the end); each row's read time is timed between its steps; "
           f"first compile {res['compile_s']:.1f} s; graphs compiled: {res['compilations']}",
           "| cached | skip | eager ms | compiled ms | through dynamo ms | every guard ms | weights read ms (same run) "
           "| eager / compiled | through dynamo / compiled | every guard / compiled | compiled / weights read |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for length, skip, e, c, d, g, r in res["rows"]:
        out.append(f"| {length} | {list(skip) or 'dense'} | {e * 1e3:.1f} | {c * 1e3:.1f} | {d * 1e3:.1f} | {g * 1e3:.1f} "
                   f"| {r * 1e3:.1f} | {e / c:.2f}x | {d / c:.3f}x | {g / c:.3f}x | {c / r:.2f}x |")
    verdicts = res.get("verdicts", {})
    out.append("compiled tokens (prompt lookup) against eager plain tokens (tss_opt/decoding/lossless.py): "
               + ", ".join(f"{list(s) or 'dense'}: {verdicts.get(s, 'identical' if a == b else 'differ')}"
                           for s, (a, b) in res["tokens"].items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="64,800")
    ap.add_argument("--skip", default="6,20,25", help="the sparse skip set measured beside the dense target")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--cache-dir", default=str(REPO / "storage" / "models"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tss_opt.models import ModelConfig, load_model

    loaded = load_model(ModelConfig(cache_dir=args.cache_dir, dtype=args.dtype))
    model = loaded.model
    skips = [(), tuple(int(i) for i in args.skip.split(",") if i)]
    res = measure(model, [int(n) for n in args.lengths.split(",")], skips, args.steps, 16)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"# compiled step: {loaded.model_id}, {args.dtype}, {args.threads} thread(s), torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("\n".join(table(res, n_bytes)))


if __name__ == "__main__":
    main()
