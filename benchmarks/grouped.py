"""Grouped trials: per-trial replay against grouped replay on the embedded model.

    python benchmarks/grouped.py --domain qa
    python benchmarks/grouped.py --domain summarization --groups 2,4,8 --repeats 2

One replay evaluator (prompt lookup, 10 tokens; batch size 8; float32; one thread) measures
the same skip sets (a level of single-layer skips, as level 1 of the CPU preset explores) in
every arm: ``per-trial`` evaluates them one at a time (``evaluate``), ``group=G`` evaluates
them G at a time in one batch of ``G x batch`` rows (``evaluate_group``). The dense prefills
are cached by an untimed warm-up first (a search's steady state); then the arms run
interleaved (repeat 1: every arm, repeat 2: every arm, ...) so drift on the shared machine hits
them alike. Reported per arm: median seconds per trial (arm time / skip sets), per-trial /
this (the speed-up), and how many (skip set, prompt) outputs and accepted lengths equal the
per-trial run's.
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

from tss_opt.assembly import assemble, compose_config, require_domain  # noqa: E402
from tss_opt.decoding.drafters import PromptLookupDrafter  # noqa: E402
from tss_opt.decoding.protocol import DecodeProtocol  # noqa: E402
from tss_opt.evaluation.prompt_set import PromptSet  # noqa: E402
from tss_opt.evaluation.replay import ReplayEvaluator  # noqa: E402
from tss_opt.progress import progress_bar  # noqa: E402

# Single-layer skips across the CPU preset's allowed range (early_barrier 2, latter_barrier 1).
SKIPS = tuple(frozenset({i}) for i in (2, 6, 10, 14, 18, 21, 25, 27))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="qa")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--groups", default="2,4,8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sets", type=int, default=len(SKIPS), help="the first N skip sets of the level")
    args = ap.parse_args()
    skips = SKIPS[: args.sets]
    groups = [int(g) for g in args.groups.split(",")]
    torch.set_num_threads(args.threads)
    cfg = compose_config([f"dtype={args.dtype}", f"+domain={args.domain}", "drafter=pld"])
    rt = assemble(cfg)
    dom = require_domain(cfg)
    ex = dom.split("calibration")[: args.prompts]
    protocol = DecodeProtocol(
        max_new_tokens=args.max_new_tokens, eos_token_ids=rt.eos_token_ids, system_prompt=dom.config.system_prompt
    )
    ev = ReplayEvaluator(
        rt.target, rt.loaded.tokenizer, lambda: PromptLookupDrafter(num_tokens=10), PromptSet.of(dom, ex, protocol),
        batch_size=args.batch_size, show_progress=False,
    )
    print(
        f"{len(ex)} {args.domain} prompts x {args.max_new_tokens} tokens, prompt lookup (10), replay batch "
        f"{args.batch_size}, {args.dtype}, {args.threads} thread(s), {len(skips)} single-layer skip sets "
        f"{[sorted(s)[0] for s in skips]}, {args.repeats} timed rounds (median), CPU"
    )
    ev.evaluate(frozenset())  # warm-up: caches the dense prefills of every batch

    def per_trial() -> list:
        return [ev.evaluate(s) for s in skips]

    def grouped(g: int):
        return lambda: [r for k in range(0, len(skips), g) for r in ev.evaluate_group(skips[k : k + g])]

    arms = {"per-trial": per_trial, **{f"group={g}": grouped(g) for g in groups}}
    times: dict[str, list[float]] = {k: [] for k in arms}
    results: dict[str, list] = {}
    bar = progress_bar(args.repeats * len(arms), "rounds", unit="arm")  # terminal only (stderr)
    for rep in range(args.repeats):
        for name, arm in arms.items():
            t0 = time.perf_counter()
            results[name] = arm()
            times[name].append((time.perf_counter() - t0) / len(skips))
            bar.write(f"# round {rep + 1} {name}: {times[name][-1]:.2f} s/trial", file=sys.stderr)
            bar.update(1)
    bar.close()
    base = results["per-trial"]
    t_base = statistics.median(times["per-trial"])
    n = len(skips) * len(ex)
    lines = [
        "| arm | s per trial (median) | rounds | per-trial / this | outputs = per-trial | A = per-trial |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name in arms:
        rs = results[name]
        pairs = [(p, q) for a, b in zip(base, rs, strict=True) for p, q in zip(a.prompts, b.prompts, strict=True)]
        same_tok = sum(p.token_ids == q.token_ids for p, q in pairs)
        same_a = sum(p.accept_length == q.accept_length for p, q in pairs)
        t = statistics.median(times[name])
        rounds = " ".join(f"{x:.2f}" for x in times[name])
        lines.append(f"| {name} | {t:.2f} | {rounds} | {t_base / t:.2f}x | {same_tok}/{n} | {same_a}/{n} |")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
