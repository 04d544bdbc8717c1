"""TAPS benchmark on the embedded model: single drafters against ``routed`` and ``merged``.

    python benchmarks/taps.py                                   # summarization + rag, 8 x 48
    python benchmarks/taps.py --domains summarization,translation --skip 6,21,25 --prompts 4
    python benchmarks/taps.py --members pld,token_recycle,eagle:storage/eagle/summarization  # a trained head

For every domain (held-out prompts) and every method, dense and combined with the TSS skip set
given by ``--skip`` (scope "verify": dense prefill, sparse verification): accepted length
(committed tokens per verification, bonus included), the domain's metric of the outputs,
tokens/s (generated tokens over the request's decoding time; the prompt's dense prefill is
computed once per prompt and reused by every method, so it is not in the time), and whether
every output equals plain decoding of the same target (TAPS is lossless: it must). Methods:
plain decoding (no drafter), each member alone, ``routed`` and ``merged`` over the members.
A member is a shipped drafter config name or ``eagle:DIR``: an EAGLE-1 head directory
(config.json + pytorch_model.bin, the format of the EAGLE loader; ``eagle:random`` is a random
head, for plumbing only); several heads may be members (one per domain, say).
Each method keeps one drafter instance for all prompts of a domain (Token Recycling's table
stays warm, as in serving). Per-member statistics of ``routed`` and ``merged`` follow each
domain's table. Methods run in a rotated order per prompt so machine drift hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _measure as bench  # noqa: E402


def member_cfg(spec: str) -> tuple[str, dict[str, Any]]:
    """A ``--members`` entry as (label, drafter config): a shipped name, or ``eagle:DIR``."""
    if spec.startswith("eagle:"):
        path = spec.split(":", 1)[1]
        if not path:
            raise SystemExit("--members: eagle:DIR needs the head directory (or eagle:random)")
        head = {"random_init": True, "checkpoint": None} if path == "random" else {"checkpoint": path}
        label = "eagle" if path == "random" else f"eagle:{Path(path).name}"
        return label, bench.shipped_drafter("eagle", **head)
    return spec, bench.shipped_drafter(spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default="summarization,rag")
    ap.add_argument("--split", default="heldout", choices=["calibration", "validation", "heldout"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument(
        "--members", default="pld,token_recycle,samd",
        help="shipped drafter configs, or eagle:DIR for a trained EAGLE head (eagle:random: a random head)",
    )
    ap.add_argument("--skip", default="6,21,25", help="the TSS skip set combined with every method")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    skip = tuple(int(s) for s in args.skip.split(",") if s.strip())
    members = [member_cfg(m) for m in args.members.split(",")]
    print(
        f"{bench.machine_line('TAPS', args.dtype, args.prompts, args.split, args.max_new_tokens)}; "
        f"members {[label for label, _ in members]}; TSS skip set {list(skip)} (scope verify)",
        flush=True,
    )
    rt = bench.load_runtime(args.dtype)
    # Members of routed/merged: each member's full config with its label (two heads differ by path).
    member_cfgs = [{**{k: v for k, v in cfg.items() if k != "_target_"}, "label": label} for label, cfg in members]
    specs: list[tuple[str, dict[str, Any] | None]] = [("plain decoding", None)]
    specs += [(label, cfg) for label, cfg in members]
    specs += [("routed", bench.shipped_drafter("routed", members=member_cfgs))]
    specs += [("merged", bench.shipped_drafter("merged", members=member_cfgs))]

    for dom_name in args.domains.split(","):
        domain = bench.load_named_domain(dom_name)
        examples = domain.split(args.split)[: args.prompts]
        methods = [bench.Method(label, cfg, s) for s in dict.fromkeys(((), skip)) for label, cfg in specs]
        seconds = bench.measure_domain(rt, methods, domain, dom_name, examples, args.max_new_tokens)
        refs = [list(ex.references) for ex in examples]
        metric = domain.metric
        print(bench.domain_heading(dom_name, examples, args.split, args.max_new_tokens, metric.name, seconds))
        print("| method | skip set | accepted length | " + metric.name + " | tok/s mean | tok/s median | identical to plain |")
        print("|---|---|---|---|---|---|---|")
        for m in methods:
            score = metric.score(m.texts, refs).value
            print(
                f"| {m.label} | {m.target_label} | {m.accept_length:.2f} | {score:.4f} | "
                f"{statistics.mean(m.tps):.2f} | {statistics.median(m.tps):.2f} | {sum(m.same)}/{len(m.same)} |"
            )
        print()
        for m in methods:
            if not hasattr(m.drafter, "member_stats"):
                continue
            extra = f", deduplicated nodes {m.drafter.deduplicated}" if hasattr(m.drafter, "deduplicated") else ""
            print(
                f"{m.label} ({m.target_label}): {m.drafter.steps} steps, "
                f"{m.drafter.total_accepted} accepted draft tokens, {m.drafter.empty_steps} empty steps{extra}"
            )
            for name, st in m.drafter.member_stats().items():
                by_depth = ", ".join(f"{a:.2f}" for a in st["acceptance_by_depth"][:6])
                print(
                    f"  {name:<14} routed {st['routed']:>4}  proposed {st['proposed']:>5}  "
                    f"accepted {st['accepted']:>4}  acceptance by depth [{by_depth}]"
                )
        print(flush=True)


if __name__ == "__main__":
    main()
