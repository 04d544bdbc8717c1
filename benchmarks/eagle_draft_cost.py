"""What one EAGLE draft costs with and without the head's draft vocabulary.

    python benchmarks/eagle_draft_cost.py --head storage/drafters/smollm2_135m/general \\
        --vocab 0 --vocab 8192 --vocab 4096 --tree 8,4,3 --tree 60,6,8

For every tree (``total_tokens,depth,top_k``) and draft-vocabulary size (``0`` = the whole
vocabulary; ``N`` = the head's ``N`` most frequent tokens), the median wall time of
``EagleDrafter.propose`` on one held-out summarization prompt, the sizes measured interleaved
(round-robin, ``--reps`` rounds) so machine drift hits them alike; the head's KV cache over the
prompt is built before timing, as in decoding (only the tree levels are timed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _measure as bench  # noqa: E402

from tss_opt.decoding.drafters.eagle import EagleDrafter, load_eagle_head  # noqa: E402
from tss_opt.evaluation.domains import format_prompt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", required=True, help="a trained head's directory (with a draft vocabulary)")
    ap.add_argument("--vocab", type=int, action="append", default=None, help="repeatable; 0 = the whole vocabulary")
    ap.add_argument("--tree", action="append", default=None, help="total_tokens,depth,top_k (repeatable)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rt = bench.load_runtime(args.dtype)
    target = rt.target
    head = load_eagle_head(args.head, target.model)
    carried = 0 if head.draft_vocab is None else int(head.draft_vocab.numel())
    domain = bench.load_named_domain("summarization")
    prompt = format_prompt(rt.loaded.tokenizer, domain.split("heldout")[0], domain.config.system_prompt)
    with torch.inference_mode():
        hidden = target.model.model(prompt[None, :-1].to(target.device)).last_hidden_state[0]
    vocabs = args.vocab or [0, carried]
    trees = [tuple(int(x) for x in t.split(",")) for t in (args.tree or ["8,4,3", "60,6,8"])]
    print(f"{bench.machine_line('EAGLE draft cost', args.dtype, 1, 'heldout', 0)}; head {args.head} carries {carried} draft tokens")
    print("| tree (total_tokens, depth, top_k) | draft vocabulary | propose ms median | vs whole vocabulary |")
    print("|---|---:|---:|---:|")
    for tree in trees:
        drafters = {}
        for n in vocabs:
            d = EagleDrafter(head, total_tokens=tree[0], depth=tree[1], top_k=tree[2], draft_vocab=n)
            d.reset(prompt[:-1])
            d.prefill_feedback(prompt[:-1], None, hidden)  # type: ignore[arg-type]
            d.propose(prompt)  # builds the head's cache over the prompt; later calls time the tree only
            drafters[n] = d
        times: dict[int, list[float]] = {n: [] for n in vocabs}
        for _ in range(args.reps):
            for n, d in drafters.items():
                t0 = time.perf_counter()
                d.propose(prompt)
                times[n].append(time.perf_counter() - t0)
        full = statistics.median(times[vocabs[0]])
        for n in vocabs:
            med = statistics.median(times[n])
            label = "whole (49,152)" if n == 0 else f"{min(n, carried)}"
            print(f"| {tree} | {label} | {med * 1e3:.1f} | {med / full:.2f}x |")


if __name__ == "__main__":
    main()
