"""float32 against bfloat16 by rows per product, interleaved in one process.

    python benchmarks/precision_rows.py                     # 4 prompts, 64 tokens, 32 new tokens
    python benchmarks/precision_rows.py --prompts 2 --max-new-tokens 8

Whether bfloat16 pays on a CPU depends on how many rows its products have: a one-row decoding
step mostly reads the weights (bfloat16 reads half the bytes), while a prompt, a verified tree
or a batch multiplies rows, which a CPU without bf16 dot products computes by converting to
float32. This loads the embedded model in both precisions and, per prompt (summarization
prompts cut to ``--length`` tokens, the two precisions in alternating order): our plain decoding
(decode tokens/s after the first token), the prompt's prefill, and one verification forward of
0, 4 and 16 chain nodes on that prompt. Prints the medians and the bfloat16/float32 ratios, and
the CPU flags ``dtype=auto`` reads (tss_opt/models/precision.py). Tokens are not compared: the
two precisions are two different targets.
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

from omegaconf import OmegaConf  # noqa: E402

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.config import config_dir  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.tree import DraftTree  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402
from tss_opt.models.precision import BF16_CPU_FLAGS, choose_dtype, cpu_flags  # noqa: E402

DTYPES = ("float32", "bfloat16")
NODES = (0, 4, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--length", type=int, default=64, help="prompt tokens (the prompt's last ones)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rts = {d: assemble(compose_config([f"dtype={d}", f"model.cache_dir={REPO / 'storage' / 'models'}"])) for d in DTYPES}
    tok = rts["float32"].loaded.tokenizer
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "summarization.yaml"))
    cal = [format_prompt(tok, ex, dom.config.system_prompt)[-args.length:] for ex in dom.split("calibration")]
    decode: dict[str, list[float]] = {d: [] for d in DTYPES}
    prefill: dict[str, list[float]] = {d: [] for d in DTYPES}
    verify: dict[str, dict[int, list[float]]] = {d: {n: [] for n in NODES} for d in DTYPES}
    for i in range(args.prompts):
        prompt = cal[i % len(cal)]
        for d in DTYPES if i % 2 == 0 else DTYPES[::-1]:
            target = rts[d].target
            res = SpeculativeEngine(target, None, eos_token_ids=[]).generate(prompt, max_new_tokens=args.max_new_tokens)
            decode[d].append((len(res.tokens) - 1) / (res.stats.total_s - res.stats.prefill_s))
            prefill[d].append(res.stats.prefill_s)
            for n in NODES:
                cache = target.new_cache()
                target.prefill(prompt, cache)
                tree = DraftTree(tokens=torch.randint(100, 20000, (n,)), parents=tuple(range(-1, n - 1)))
                t0 = time.perf_counter()
                target.verify_forward(5, tree, cache, len(prompt))
                verify[d][n].append(time.perf_counter() - t0)
    flags = sorted(f for f in cpu_flags() if f in BF16_CPU_FLAGS) or ["none of " + ", ".join(BF16_CPU_FLAGS)]
    print(f"# precision_rows: {args.prompts} prompts of {args.length} tokens, {args.max_new_tokens} new tokens; "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; bf16 CPU flags: {', '.join(flags)}; "
          f"dtype=auto decodes in {choose_dtype('auto', 'cpu').dtype} here\n")
    med = statistics.median
    rows = [("plain decoding, tokens/s (1 row per step)", {d: med(decode[d]) for d in DTYPES}, True),
            (f"prefill of the prompt, ms ({args.length} rows)", {d: med(prefill[d]) * 1e3 for d in DTYPES}, False)]
    rows += [(f"verification of {n} chain nodes, ms ({n + 1} rows)", {d: med(verify[d][n]) * 1e3 for d in DTYPES}, False)
             for n in NODES]
    print("| measure | float32 | bfloat16 | bfloat16 faster by |")
    print("|---|---:|---:|---:|")
    for name, v, higher_is_better in rows:
        gain = v["bfloat16"] / v["float32"] if higher_is_better else v["float32"] / v["bfloat16"]
        print(f"| {name} | {v['float32']:.1f} | {v['bfloat16']:.1f} | {gain:.2f}x |")
    per_prompt = [b / a for a, b in zip(decode["float32"], decode["bfloat16"])]
    print(f"\nplain decoding, bfloat16 / float32 per prompt: {', '.join(f'{r:.2f}' for r in per_prompt)} "
          f"(median {med(per_prompt):.2f}x)")


if __name__ == "__main__":
    main()
