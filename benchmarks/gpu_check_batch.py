"""Section 4 of the GPU check: batched serving, each row on its own skip set.

``GPU_CHECK_BATCH`` rows (default 64 on a GPU, 6 on a CPU) over three "domains" (dense and
two skip sets) decode together in one :class:`~tss_opt.decoding.batch.BatchEngine` with
prompt lookup, in float32 and bfloat16. Checks: every row's greedy tokens equal the same
request decoded alone (float32: must; bfloat16: a first divergence at a near-tie of the solo
run is reported as ``near-tie``, as in section 1). Figures: tokens/s of the batch against the
same requests decoded one after another, and the depth cap the scheduler's measured policy
chose at full batch.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

import torch

from tss_opt.decoding.batch import BatchEngine
from tss_opt.decoding.batch_budget import DepthPolicy, measure_batch_latency
from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.lossless import check_lossless
from tss_opt.decoding.target import TargetModel
from tss_opt.models import load_model


def batched_serving(rep: Any, base_model: Any, sparse_set: Any, prompts_of: Any, device: str, tokens: int,
                    budget_s: float) -> None:
    """Section 4 (module docstring); ``rep`` is gpu_check's Report."""
    on_gpu = device.startswith("cuda")
    n_rows = int(os.environ.get("GPU_CHECK_BATCH", "64" if on_gpu else "6"))
    rep.line(f"## 4. Batched serving: {n_rows} rows, three skip sets, prompt lookup, {tokens} tokens")
    rep.line("| dtype | rows | rows == alone | near-ties | batch tok/s | alone tok/s | batch / alone | depth cap at full batch |")
    rep.line("|---|---:|---:|---:|---:|---:|---:|---:|")
    for dtype in ("float32", "bfloat16"):
        if rep.elapsed() > budget_s:
            rep.skip(f"batched serving {dtype}", f"time budget ({budget_s:.0f} s) spent")
            continue
        try:
            _one_dtype(rep, base_model(dtype, device), sparse_set, prompts_of, n_rows, tokens, dtype)
        except Exception as e:  # report and go on
            rep.fail(f"batched serving {dtype}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)


def _one_dtype(rep: Any, model_cfg: dict[str, Any], sparse_set: Any, prompts_of: Any, n_rows: int, tokens: int,
               dtype: str) -> None:
    loaded = load_model(model_cfg)
    target = TargetModel(loaded.model)
    L = loaded.num_layers
    skips = [frozenset(), frozenset(sparse_set(L)), frozenset({L // 3})]
    base = prompts_of(loaded, 3)
    eos = [int(loaded.tokenizer.eos_token_id)] if loaded.tokenizer.eos_token_id is not None else []
    rows = [(base[i % len(base)], skips[i % 3]) for i in range(n_rows)]

    def drafter() -> PromptLookupDrafter:
        return PromptLookupDrafter(num_tokens=4, max_ngram=3, min_ngram=1)

    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    # Alone: each distinct (prompt, skip set) once (the batch repeats them), timed one after another.
    alone: dict[tuple[int, frozenset[int]], list[int]] = {}
    sync()
    t0 = time.perf_counter()
    n_alone = 0
    for i, (p, s) in enumerate(rows[: min(n_rows, 9)]):
        out = SpeculativeEngine(target, drafter(), eos_token_ids=eos).generate(p, max_new_tokens=tokens, skip=s).tokens.tolist()
        alone[(i % len(base), s)] = out
        n_alone += len(out)
    sync()
    alone_tps = n_alone / (time.perf_counter() - t0)
    latency = measure_batch_latency(target, rows=(1, 4, 16, 64) if n_rows > 16 else (1, 2, 4, 8), repeats=1)
    policy = DepthPolicy(latency=latency)
    batch = BatchEngine(target, policy)
    admitted = [batch.admit(p, max_new_tokens=tokens, drafter=drafter(), skip=s, eos_token_ids=eos) for p, s in rows]
    sync()
    t0 = time.perf_counter()
    caps = []
    while batch.rows:
        full = len(batch.rows) == n_rows
        batch.step()
        if full and batch.last_depth is not None:
            caps.append(batch.last_depth)
    sync()
    elapsed = time.perf_counter() - t0
    got = [r.result().tokens.tolist() for r in admitted]
    same = ties = 0
    for i, (g, (p, s)) in enumerate(zip(got, rows)):
        want = alone.get((i % len(base), s))
        if want is None:
            continue
        if g == want:
            same += 1
        elif check_lossless(target, p, want, g, sorted(s)).verdict == "near_tie":  # only in half precision
            ties += 1
    checked = sum(1 for i, (p, s) in enumerate(rows) if (i % len(base), s) in alone)
    batch_tps = sum(len(g) for g in got) / elapsed
    cap = f"{max(set(caps), key=caps.count)}" if caps else "n/a"
    rep.line(f"| {dtype} | {n_rows} | {same}/{checked} | {ties} | {batch_tps:.1f} | {alone_tps:.1f} | "
             f"{batch_tps / alone_tps:.2f}x | {cap} |")
    if same + ties < checked:
        rep.fail(f"batched serving {dtype}: {checked - same - ties} row(s) differ from the request alone")
    del loaded, target
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
