"""Where a cheaper trial should be spent: more calibration prompts, or more tokens per prompt?

The search's verdict on a skip set is a one-sided paired bound (docs/search.md): a set holds
when ``mean(d) - t_{c,n-1} * sd(d) / sqrt(n) >= -eps * |dense mean|`` for accepted length and
for the metric, where ``d_i`` is the per-prompt difference to dense. A trial's cost grows
about linearly in prompts ``n`` and in tokens ``T`` (the dense prefill is reused); the bound's
half-width shrinks as ``1 / sqrt(n)`` with more prompts, and as whatever ``sd(d)`` does with
more tokens. This script measures ``sd(d)`` at several ``T`` on the same prompts, with the
replay evaluator (exact in float32; its figures equal the engine's), and prints per domain and
quantity the relative half-width at ``n`` = 16 and 32 and the *efficiency*
``half-width x sqrt(cost)`` (cost = generated tokens per prompt): for a fixed budget the
lever with the smaller product gives the tighter bound.

    python benchmarks/bound_width.py                       # summarization and qa, T = 24 and 48
    python benchmarks/bound_width.py --domains mmlu --tokens 24,48,96 --skips 6,8,11,22

Prompts: the calibration and validation splits joined (32 per shipped domain); the held-out
split is never read. Skip sets: single layers (``--skips``), the sets level 1 of a search
measures first.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def per_prompt(result: object) -> tuple[list[float], list[float], list[int]]:
    """``(accept_length, metric, new_tokens)`` per prompt of an evaluation."""
    prompts = result.prompts  # type: ignore[attr-defined]
    return [p.accept_length for p in prompts], [p.score for p in prompts], [p.new_tokens for p in prompts]


def half_width(diffs: list[float], n: int, confidence: float) -> float:
    """``t_{c, n-1} * sd(d) / sqrt(n)``: the bound's half-width with ``n`` prompts of this spread."""
    from tss_opt.search.feasibility import t_quantile

    return t_quantile(confidence, n - 1) * statistics.stdev(diffs) / math.sqrt(n)


def measure(domain: str, tokens: int, skips: list[frozenset[int]], threads: int) -> dict[str, object]:
    """Per skip set, the per-prompt figures on calibration + validation at ``tokens`` tokens."""
    import torch

    from tss_opt.assembly import assemble, build_evaluator, compose_config, require_domain

    torch.set_num_threads(threads)
    cfg = compose_config([f"+domain={domain}", f"search.max_new_tokens={tokens}", "search.prompts=null"])
    rt = assemble(cfg)
    dom = require_domain(cfg)
    evs = [build_evaluator(cfg, "replay", runtime=rt, split=s, domain=dom) for s in ("calibration", "validation")]
    for ev in evs:
        ev.show_progress = False
    out: dict[str, object] = {}
    t0 = time.perf_counter()
    for skip in [frozenset(), *skips]:
        a, m, t = [], [], []
        for ev in evs:
            pa, pm, pt = per_prompt(ev.evaluate(skip))
            a += pa
            m += pm
            t += pt
        out[",".join(map(str, sorted(skip))) or "dense"] = (a, m, t)
        print(f"# {domain} T={tokens} skip={sorted(skip)}: {len(a)} prompts", file=sys.stderr, flush=True)
    out["_seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domains", default="summarization,qa")
    p.add_argument("--tokens", default="24,48", help="new tokens per prompt to compare")
    p.add_argument("--skips", default="6,8,11,22", help="single layers to measure against dense")
    p.add_argument("--confidence", type=float, default=0.9, help="the search's one-sided confidence")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    skips = [frozenset({int(x)}) for x in args.skips.split(",")]
    token_counts = [int(x) for x in args.tokens.split(",")]
    print(f"replay evaluator, float32, {args.threads} thread(s); prompts: calibration + validation; "
          f"confidence {args.confidence}; half-widths relative to dense's mean\n")
    for domain in args.domains.split(","):
        rows = []
        for T in token_counts:
            res = measure(domain, T, skips, args.threads)
            dense_a, dense_m, dense_t = res["dense"]  # type: ignore[misc]
            n_all = len(dense_a)
            cost = statistics.fmean(dense_t)  # generated tokens per prompt (dense)
            for key, val in res.items():
                if key in ("dense", "_seconds"):
                    continue
                a, m, _ = val  # type: ignore[misc]
                for name, xs, ref in (("accept", a, dense_a), ("metric", m, dense_m)):
                    d = [x - r for x, r in zip(xs, ref, strict=True)]
                    scale = abs(statistics.fmean(ref)) or 1.0
                    h16 = half_width(d[:16], 16, args.confidence) / scale
                    hn = half_width(d, n_all, args.confidence) / scale
                    # cost-normalised width at n prompts: width * sqrt(n * tokens) (n cancels out)
                    eff = hn * math.sqrt(n_all * cost)
                    rows.append((T, key, name, statistics.fmean(d) / scale, h16, hn, cost, eff))
            print(f"# {domain} T={T}: {res['_seconds']:.0f} s", file=sys.stderr, flush=True)
        print(f"### {domain}\n")
        print(f"| T | skip | quantity | mean diff (rel) | half-width n=16 | half-width n={n_all} "
              "| tokens/prompt | width x sqrt(n x tokens) |")
        print("|---:|---|---|---:|---:|---:|---:|---:|")
        for T, key, name, md, h16, hn, cost, eff in rows:
            print(f"| {T} | {key} | {name} | {md:+.4f} | {h16:.4f} | {hn:.4f} | {cost:.1f} | {eff:.3f} |")
        print("\nmedian width x sqrt(n x tokens), by tokens and quantity (smaller: the better use of a budget):\n")
        print("| quantity | " + " | ".join(f"T={T}" for T in token_counts) + " |")
        print("|---|" + "---:|" * len(token_counts))
        for name in ("accept", "metric"):
            meds = [statistics.median(r[7] for r in rows if r[0] == T and r[2] == name) for T in token_counts]
            print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in meds) + " |")
        print()


if __name__ == "__main__":
    main()
