"""Section 5 of the GPU check: the compiled verification step.

In bfloat16 on the base model (the embedded model, or the random stand-in): the median time of
a plain step (one token verified) eager and compiled (``decoding/compiled.py``), dense and on
one skip set, at 64 and 800 cached tokens (64 only on a CPU), against the time to read every
weight once; then the compiled target with prompt lookup against the eager target's plain
greedy tokens, per skip set (a first divergence at a near-tie of the eager run is reported as
``near-tie``, training/t2d.py's rule, as in section 1; any other difference fails). Figures
and helpers: ``compiled_step.py``.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
from compiled_step import measure, table

from tss_opt.decoding.lossless import check_lossless
from tss_opt.decoding.target import TargetModel
from tss_opt.models import load_model


def compiled_section(rep: Any, base_model: Any, sparse_set: Any, device: str, budget_s: float) -> None:
    """Section 5 (module docstring); ``rep`` is gpu_check's Report."""
    on_gpu = device.startswith("cuda")
    lengths = [64, 800] if on_gpu else [64]
    steps = int(os.environ.get("GPU_CHECK_COMPILED_STEPS", "30" if on_gpu else "3"))
    dtype = "bfloat16"
    rep.line(f"## 5. Compiled step ({dtype}; plain steps at {', '.join(map(str, lengths))} cached tokens, "
             f"median of {steps})")
    if rep.elapsed() > budget_s:
        rep.skip(f"compiled step {dtype}", f"time budget ({budget_s:.0f} s) spent")
        return
    try:
        loaded = load_model(base_model(dtype, device))
        model = loaded.model
        skips = [(), tuple(sparse_set(loaded.num_layers))]
        res = measure(model, lengths, skips, steps, 32 if on_gpu else 4)
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for line in table(res, n_bytes):
            rep.line(line)
        eager = TargetModel(model)
        for skip, (want, got) in res["tokens"].items():
            div = check_lossless(eager, res["prompt"], want, got, skip).divergence
            label = f"compiled step {dtype} skip={list(skip)}"
            if div is None:
                rep.line(f"{label}: tokens equal")
            elif div.near_tie:
                rep.line(f"{label}: near-tie at token {div.position} (margin {div.margin:.3g})")
            else:
                rep.fail(f"{label}: tokens differ from eager at {div.position} (margin {div.margin:.3g})")
        del model, loaded, eager
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception as e:  # report and go on
        rep.fail(f"compiled step {dtype}: {type(e).__name__}: {e}")
        traceback.print_exc(limit=3)
