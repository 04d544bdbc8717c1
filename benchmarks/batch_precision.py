"""Batched against alone, judged by the lossless rule: the server's model runner in one precision.

    python benchmarks/batch_precision.py bfloat16          # 16 held-out prompts x 32 tokens
    python benchmarks/batch_precision.py float32 --prompts 8 --max-new-tokens 16

Each prompt (held-out summarization, qa and mmlu prompts, in turn, with each domain's system
prompt) is decoded greedily alone (the batch engine with one row) and then all of them as
rows of one batch (``BatchEngine``, the runner of ``python -m tss_opt.cli.serve``); each
batched output is judged against its solo output by ``tss_opt/decoding/lossless.py``
(identical; a first difference at a near-tie of the plain target, half precision only; or
diverged, which exits 1). In half precision a batch's products round differently with its
composition, so a row may take the other side of a near-tie; in float32 every row must be
identical. No drafter: the difference under test is the batch, not speculation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from tss_opt.config import config_dir  # noqa: E402
from tss_opt.decoding.batch import BatchEngine  # noqa: E402
from tss_opt.decoding.lossless import check_lossless  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402
from tss_opt.models import ModelConfig, load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dtype", help="float32, bfloat16, float16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelConfig(cache_dir=str(REPO / "storage" / "models"), dtype=args.dtype))
    target = TargetModel(loaded.model)
    pools = []
    for name in ("summarization", "qa", "mmlu"):
        dom = load_domain(OmegaConf.load(config_dir() / "domain" / f"{name}.yaml"))
        pools.append([format_prompt(loaded.tokenizer, ex, dom.config.system_prompt) for ex in dom.split("heldout")])
    prompts = [pools[i % 3][i // 3] for i in range(args.prompts)]  # domains in turn
    alone = []
    for p in prompts:
        engine = BatchEngine(target)
        row = engine.admit(p, max_new_tokens=args.max_new_tokens)
        engine.run()
        alone.append(row.result().tokens.tolist())
    engine = BatchEngine(target)
    rows = [engine.admit(p, max_new_tokens=args.max_new_tokens) for p in prompts]
    engine.run()
    verdicts = []
    for i, (p, want, row) in enumerate(zip(prompts, alone, rows)):
        check = check_lossless(target, p, want, row.result().tokens.tolist())
        verdicts.append(check.verdict)
        if check.divergence is not None:
            d = check.divergence
            print(f"prompt {i + 1} ({len(p)} tokens): {check.verdict} at new token {d.position}, the plain target's "
                  f"margin {d.margin:.3g} logits (tolerance {d.tolerance:.3g})")
    counts = {v: verdicts.count(v) for v in ("identical", "near_tie", "diverged")}
    print(f"{args.dtype}, {len(prompts)} rows x {args.max_new_tokens} tokens, batched against alone: "
          f"identical {counts['identical']}, near-tie {counts['near_tie']}, diverged {counts['diverged']}")
    if counts["diverged"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
