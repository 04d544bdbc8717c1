"""Trial wall time: the replay evaluator against the engine evaluator on the embedded model.

    python benchmarks/replay.py                       # 8 summarization prompts x 32 tokens, fp32+bf16
    python benchmarks/replay.py --dtypes float32 --batch-sizes 1,8 --repeats 1

Both evaluators run the same prompts, drafter (prompt lookup, 10 tokens) and skip sets in one
process; every evaluator does one untimed warm-up trial first (dense prefills are then cached
by both, as in a search's steady state), then the timed trials run interleaved (repeat 1:
every evaluator, repeat 2: every evaluator, ...) so machine drift hits them alike. Reported
per (dtype, skip set, evaluator): median trial seconds, the engine's median over it (the
speed-up), pooled accepted length, and how many prompts' outputs and accepted lengths equal
the engine's.
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
from tss_opt.evaluation.evaluator import SpecDecodeEvaluator  # noqa: E402
from tss_opt.evaluation.prompt_set import PromptSet  # noqa: E402
from tss_opt.evaluation.replay import ReplayEvaluator  # noqa: E402
from tss_opt.progress import progress_bar  # noqa: E402

SKIPS = (frozenset(), frozenset({6, 21, 25}))  # dense, and layers FACTS.md found harmless


def run_dtype(dtype: str, args: argparse.Namespace) -> list[str]:
    cfg = compose_config([f"dtype={dtype}", f"+domain={args.domain}", "drafter=pld"])
    rt = assemble(cfg)
    dom = require_domain(cfg)
    protocol = DecodeProtocol(
        max_new_tokens=args.max_new_tokens, eos_token_ids=rt.eos_token_ids, system_prompt=dom.config.system_prompt,
        scope=args.scope,
    )
    prompts = PromptSet.of(dom, dom.split("calibration")[: args.prompts], protocol)
    ex = prompts.examples
    factory = lambda: PromptLookupDrafter(num_tokens=10)  # noqa: E731
    evs: dict[str, object] = {
        "engine": SpecDecodeEvaluator(rt.target, rt.loaded.tokenizer, factory, prompts, show_progress=False)
    }
    for b in args.batch_sizes:
        evs[f"replay bs={b}"] = ReplayEvaluator(
            rt.target, rt.loaded.tokenizer, factory, prompts, batch_size=b, show_progress=False
        )
    lines = []
    # One unit per evaluation (warm-up included); drawn on a terminal only (stderr).
    bar = progress_bar(len(SKIPS) * len(evs) * (args.repeats + 1), f"{dtype} evaluations", unit="run")
    for skip in SKIPS:
        times: dict[str, list[float]] = {k: [] for k in evs}
        results = {}
        for name, ev in evs.items():
            bar.set_postfix_str(f"skip {sorted(skip)}: warm-up {name}")
            ev.evaluate(skip)  # warm-up: caches the dense prefills, first-call overheads
            bar.update(1)
        for _ in range(args.repeats):
            for name, ev in evs.items():
                t0 = time.perf_counter()
                results[name] = ev.evaluate(skip)
                times[name].append(time.perf_counter() - t0)
                bar.update(1)
        eng = results["engine"]
        t_eng = statistics.median(times["engine"])
        for name in evs:
            r = results[name]
            same_tok = sum(p.token_ids == q.token_ids for p, q in zip(eng.prompts, r.prompts, strict=True))
            same_a = sum(p.accept_length == q.accept_length for p, q in zip(eng.prompts, r.prompts, strict=True))
            t = statistics.median(times[name])
            lines.append(
                f"| {dtype} | {sorted(skip)} | {name} | {t:.2f} | {t_eng / t:.2f}x | {r.accept_length:.3f} | "
                f"{same_tok}/{len(ex)} | {same_a}/{len(ex)} |"
            )
            bar.write(lines[-1])  # above the bar on a terminal; a plain line elsewhere
    bar.close()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="summarization")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scope", default="verify")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    torch.set_num_threads(args.threads)
    print(
        f"{args.prompts} {args.domain} prompts x {args.max_new_tokens} tokens, prompt lookup (10), scope "
        f"{args.scope}, {args.threads} thread(s), {args.repeats} timed trials per evaluator (median), CPU only"
    )
    header = [
        "| dtype | skip | evaluator | trial s (median) | engine / this | accepted length | outputs = engine | A = engine |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(header), flush=True)
    lines = []
    for dtype in args.dtypes.split(","):
        lines += run_dtype(dtype, args)
    print("\n" + "\n".join(header + lines))


if __name__ == "__main__":
    main()
