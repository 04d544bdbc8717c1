"""Prepacked bfloat16 products against ``F.linear``, side by side in one process.

    python benchmarks/packed_linear.py                       # 4 prompts per length, 64 tokens
    python benchmarks/packed_linear.py --prompts 2 --lengths 64 --max-new-tokens 32
    python benchmarks/packed_linear.py --compile             # and the compiled step's graphs

On the embedded model in bfloat16 (tss_opt/decoding/linear.py: a CPU's ``F.linear`` reorders
the weight on every call; our forwards use weights reordered once, for up to 16 rows), three
ways of decoding, each with the packed products on and off (``PACK_MAX_ROWS`` 16 or 0, the
same model and process), interleaved per prompt with a rotating order: our plain decoding
(one row per step), prompt lookup sized to the hardware (a few rows per step) and a batch of
8 rows (the server's runner, one token per row per step). Columns: decode tokens/s median
over prompts (after the first token: the prefill's products have more rows than the packed
path takes), the packed/unpacked ratio (median of per-prompt ratios), and whether the tokens
are identical packed and unpacked (they must be: the two paths compute the same products; any
difference prints FAIL and exits 1). ``--compile`` adds three arms on the compiled step
(``decoding/compiled.py``), each through two compiled targets of the same model whose graphs
run the products of 2-16 slots on the packed weights or through ``aten::mm``
(``GRAPH_MIN_ROWS`` 2 or 17 when each is traced): plain decoding (one slot per step, the same
fused product in both graphs: the arm that shows the noise), prompt lookup sized to the
packed graphs' latency table (both targets run that one drafter) and prompt lookup's fixed
chain of 10 (steps of up to 11 slots). Without bfloat16 products in the CPU's oneDNN it says so
and exits 0: there is nothing to compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.config import config_dir  # noqa: E402
from tss_opt.decoding import linear  # noqa: E402
from tss_opt.decoding.batch import BatchEngine  # noqa: E402
from tss_opt.decoding.compiled import CompiledTarget  # noqa: E402
from tss_opt.decoding.drafters import build_drafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402

ROWS_ON = linear.PACK_MAX_ROWS
GRAPH_ON = linear.GRAPH_MIN_ROWS


def _at_length(ids: torch.Tensor, length: int, filler: torch.Tensor) -> torch.Tensor:
    """``ids`` cut or preceded by ``filler`` tokens to ``length`` (0: as it is)."""
    if length <= 0:
        return ids
    if len(ids) >= length:
        return ids[-length:]
    pad = filler.repeat(length // max(1, len(filler)) + 1)[: length - len(ids)]
    return torch.cat([pad, ids])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--lengths", default="64,0", help="prompt lengths in tokens; 0: the domain's own")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="rows of the batch arm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also the compiled step, graphs with and without the packed products")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not linear.packing_supported(torch.device("cpu"), torch.bfloat16):
        print("this CPU's oneDNN computes no bfloat16 products: nothing is packed, nothing to compare")
        return
    rt = assemble(compose_config(["dtype=bfloat16", f"model.cache_dir={REPO / 'storage' / 'models'}"]))
    target, tok = rt.target, rt.loaded.tokenizer
    packed = sum(hasattr(m, "_tss_packed_weight") for m in rt.loaded.model.modules())
    eos = list(rt.eos_token_ids)
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "summarization.yaml"))
    cal = [format_prompt(tok, ex, dom.config.system_prompt) for ex in dom.split("calibration")]
    pld = build_drafter(OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / "pld.yaml"), {"num_tokens": "auto"}),
                        target, rt.loaded)
    n = args.max_new_tokens

    Arm = Callable[[list[torch.Tensor], bool], tuple[list[list[int]], float]]

    def single(drafter: object | None, targets: tuple[object, object] | None = None) -> Arm:
        """One request; ``on`` selects the packed products: eagerly by ``PACK_MAX_ROWS``, on the
        compiled step by the target whose graphs were traced with them (``targets``: on, off)."""
        def run(prompts: list[torch.Tensor], on: bool) -> tuple[list[list[int]], float]:
            if targets is None:
                linear.PACK_MAX_ROWS, linear.GRAPH_MIN_ROWS, tgt = (ROWS_ON if on else 0), GRAPH_ON, target
            else:  # each compiled target only ever sees the value it was traced with: no recompiles
                linear.PACK_MAX_ROWS, linear.GRAPH_MIN_ROWS = ROWS_ON, GRAPH_ON if on else ROWS_ON + 1
                tgt = targets[0] if on else targets[1]
            res = SpeculativeEngine(tgt, drafter, eos_token_ids=eos).generate(prompts[0], max_new_tokens=n)
            decode_s = res.stats.total_s - res.stats.prefill_s
            return [res.tokens.tolist()], (len(res.tokens) - 1) / decode_s

        return run

    def batch(prompts: list[torch.Tensor], on: bool) -> tuple[list[list[int]], float]:
        linear.PACK_MAX_ROWS, linear.GRAPH_MIN_ROWS = (ROWS_ON if on else 0), GRAPH_ON
        engine = BatchEngine(target)
        rows = [engine.admit(p, max_new_tokens=n) for p in prompts]
        engine.step()  # the prefills (rows of whole prompts: F.linear either way)
        t0 = time.perf_counter()
        engine.run()
        outs = [r.result().tokens.tolist() for r in rows]
        return outs, sum(len(o) - 1 for o in outs) / (time.perf_counter() - t0)

    arms: dict[str, Arm] = {
        "plain decoding": single(None), "prompt lookup, auto": single(pld), f"batch of {args.batch}, plain": batch,
    }
    if args.compile:
        graphs = (CompiledTarget(rt.loaded.model), CompiledTarget(rt.loaded.model))  # packed graphs, aten::mm graphs
        linear.PACK_MAX_ROWS, linear.GRAPH_MIN_ROWS = ROWS_ON, GRAPH_ON
        pld_graph = build_drafter(OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / "pld.yaml"),
                                                  {"num_tokens": "auto"}), graphs[0], rt.loaded)
        pld10 = build_drafter(OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / "pld.yaml"), {"num_tokens": 10}),
                              graphs[0], rt.loaded)
        arms.update({"plain decoding, compiled": single(None, graphs),
                     "prompt lookup, auto, compiled": single(pld_graph, graphs),
                     "prompt lookup, 10 tokens, compiled": single(pld10, graphs)})
    print(f"# packed_linear: {packed} linear layers packed; {torch.get_num_threads()} thread(s), torch {torch.__version__}; "
          f"{args.prompts} prompts x {n} new tokens per length; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    failures = []
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.compile:  # compile every bucket (and the dynamic window) before anything is timed
        for length in lengths:
            for name in [a for a in arms if a.endswith("compiled")]:
                for on in (True, False):
                    arms[name]([_at_length(cal[0], length, cal[-1])], on)
    for length in lengths:
        figures: dict[tuple[str, bool], list[float]] = {}
        same: dict[str, int] = {}
        for i in range(args.prompts):
            ids = _at_length(cal[i % len(cal)], length, cal[-1])
            group = [_at_length(cal[(i + k) % len(cal)], length, cal[-1]) for k in range(args.batch)]
            order = [(a, on) for a in arms for on in (True, False)]
            order = order[i % len(order):] + order[: i % len(order)]
            outs: dict[tuple[str, bool], list[list[int]]] = {}
            for name, on in order:
                toks, tps = arms[name](group if name.startswith("batch") else [ids], on)
                outs[(name, on)] = toks
                figures.setdefault((name, on), []).append(tps)
            linear.PACK_MAX_ROWS, linear.GRAPH_MIN_ROWS = ROWS_ON, GRAPH_ON
            for name in arms:
                ok = outs[(name, True)] == outs[(name, False)]
                same[name] = same.get(name, 0) + ok
                if not ok:
                    failures.append(f"{name}, length {length}, prompt {i}: tokens differ packed and unpacked")
        print(f"\n### prompts of {length or 'the domain’s own length'} tokens, bfloat16\n")
        print("| method | F.linear (aten::mm) tok/s | packed tok/s | packed / F.linear | identical tokens |")
        print("|---|---:|---:|---:|---:|")
        for name in arms:
            off, on = figures[(name, False)], figures[(name, True)]
            ratio = statistics.median(a / b for a, b in zip(on, off))
            print(f"| {name} | {statistics.median(off):.2f} | {statistics.median(on):.2f} | {ratio:.2f}x | "
                  f"{same[name]}/{args.prompts} |", flush=True)
    if args.compile:  # one graph per bucket and function: a toggle that recompiled would show here
        print(f"\ngraphs compiled: packed target {graphs[0].compilations}, aten::mm target {graphs[1].compilations}")
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
