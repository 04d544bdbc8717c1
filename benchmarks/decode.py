"""Decoding benchmark on the embedded model: HF greedy / prompt lookup against our engine.

    python benchmarks/decode.py                      # 16 summarization prompts, 96 tokens, fp32+bf16
    python benchmarks/decode.py --prompts 4 --max-new-tokens 32 --dtypes float32
    python benchmarks/decode.py --domains summarization,qa --methods greedy,pld,token_recycle_15

Methods run interleaved per prompt (prompt 1: every method, prompt 2: every method, ...) so
machine drift hits them alike. Reported per (domain, dtype, method): median and mean tokens/s
over prompts, the ratio of means to HF greedy measured in the same run, accepted length
(committed tokens / verification steps, bonus included) and whether every output equals HF
greedy's (for skip-set methods: our plain sparse decoding of the same skip set). A last table
measures the skip controller's overhead: decode steps through the skip mechanism (empty skip
set) against the untouched model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402

SKIP3 = (6, 21, 25)  # layers FACTS.md found harmless one by one on summarization


@dataclass
class Method:
    name: str
    run: Callable[[torch.Tensor, int], tuple[list[int], float, float]]  # -> tokens, seconds, A
    reference: str = "greedy"  # which method's output it must equal
    tps: list[float] = field(default_factory=list)
    al: list[float] = field(default_factory=list)
    same: list[bool] = field(default_factory=list)


def hf_method(model, eos: list[int], **gen_kwargs) -> Callable:
    def run(ids: torch.Tensor, n: int):
        t0 = time.perf_counter()
        out = model.generate(
            ids[None], max_new_tokens=n, do_sample=False, eos_token_id=eos, **gen_kwargs
        )
        dt = time.perf_counter() - t0
        return out[0, len(ids) :].tolist(), dt, float("nan")

    return run


def engine_method(
    target: TargetModel, drafter_factory: Callable, eos: list[int], skip=()
) -> Callable:
    def run(ids: torch.Tensor, n: int):
        eng = SpeculativeEngine(target, drafter_factory(), eos_token_ids=eos)
        t0 = time.perf_counter()
        res = eng.generate(ids, max_new_tokens=n, skip=skip)
        dt = time.perf_counter() - t0
        return res.tokens.tolist(), dt, res.stats.accept_length

    return run


def tree_drafter_factories(target: TargetModel, loaded) -> dict[str, Callable]:
    """Tree drafters (Token Recycling, SAMD, EAGLE with a random head), when available."""
    out: dict[str, Callable] = {}
    try:
        from tss_opt.decoding.drafters.registry import build_drafter
    except ImportError:
        return out
    specs = {
        "token_recycle_15": {"name": "token_recycle", "template": "builtin:token_recycle_15.json"},
        "token_recycle_large": {"name": "token_recycle", "template": "builtin:token_recycle_large.json"},
        "samd": {"name": "samd"},
        "samd_large": {"name": "samd", "threshold": 2, "template": "builtin:token_recycle_large.json"},
        "eagle_random": {"name": "eagle", "random_init": True, "path": None},
    }
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir

    for key, spec in specs.items():
        base_file = config_dir() / "drafter" / f"{spec['name']}.yaml"
        if not base_file.is_file():
            continue
        cfg = OmegaConf.to_container(OmegaConf.merge(OmegaConf.load(base_file), spec), resolve=True)
        # One instance per method for the whole run: Token Recycling's table stays warm across
        # prompts, as in serving (a fresh drafter per prompt would start every table empty).
        drafter = build_drafter(cfg, target, loaded)
        out[key] = lambda d=drafter: d
    return out


def overhead(model, target: TargetModel, ids: torch.Tensor, steps: int, rounds: int) -> tuple[float, float, float]:
    """Decode steps on the untouched model vs inside an empty skip context, in pairs whose
    order alternates; returns (median s/step untouched, median s/step through the skip
    mechanism, median of the per-pair ratios)."""
    from tss_opt.decoding.cache import SkipAwareCache

    @torch.inference_mode()
    def loop() -> float:
        cache = SkipAwareCache(config=model.config)
        logits = model(input_ids=ids[None], cache=cache, use_cache=True).logits[0, -1]
        tok = int(logits.argmax())
        t0 = time.perf_counter()
        for i in range(steps):
            pos = torch.tensor([[len(ids) + i]])
            logits = model(input_ids=torch.tensor([[tok]]), position_ids=pos, cache=cache, use_cache=True).logits[0, -1]
            tok = int(logits.argmax())
        return (time.perf_counter() - t0) / steps

    def skipped() -> float:
        with target.skip(()):
            return loop()

    plain, ctl, ratios = [], [], []
    for r in range(rounds):
        if r % 2:
            b, a = skipped(), loop()
        else:
            a, b = loop(), skipped()
        plain.append(a)
        ctl.append(b)
        ratios.append(b / a)
    return statistics.median(plain), statistics.median(ctl), statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default="summarization")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--methods", default="greedy,hf_pld,pld,pld_skip3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--overhead-rounds", type=int, default=21)
    ap.add_argument("--only-overhead", action="store_true", help="skip the decoding tables")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wanted = args.methods.split(",")
    print(
        f"machine: {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"{args.prompts} prompts x {args.max_new_tokens} new tokens per domain",
        flush=True,
    )

    for dtype in args.dtypes.split(","):
        rt = assemble(compose_config([f"dtype={dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]))
        loaded, target = rt.loaded, rt.target
        model, tok = loaded.model, loaded.tokenizer
        eos = [tok.eos_token_id]
        from tss_opt.decoding.drafters import PromptLookupDrafter

        sparse_greedy = engine_method(target, lambda: None, eos, skip=SKIP3)

        catalogue: dict[str, Method] = {
            "greedy": Method("HF greedy generate", hf_method(model, eos)),
            "hf_pld": Method(
                "HF prompt lookup (10)", hf_method(model, eos, prompt_lookup_num_tokens=10)
            ),
            "pld": Method(
                "ours: prompt lookup (10)",
                engine_method(target, lambda: PromptLookupDrafter(10, 3), eos),
            ),
            "pld_skip3": Method(
                f"ours: prompt lookup, skip {list(SKIP3)}",
                engine_method(target, lambda: PromptLookupDrafter(10, 3), eos, skip=SKIP3),
                reference="sparse_greedy",
            ),
        }
        for key, factory in tree_drafter_factories(target, loaded).items():
            catalogue[key] = Method(f"ours: {key}", engine_method(target, factory, eos))
        unknown = [m for m in wanted if m not in catalogue]
        if unknown:
            raise SystemExit(f"unknown method(s) {unknown}; available: {', '.join(catalogue)}")
        methods = [catalogue[m] for m in wanted]
        need_sparse_ref = any(m.reference == "sparse_greedy" for m in methods)

        for dom_name in [] if args.only_overhead else args.domains.split(","):
            from omegaconf import OmegaConf

            from tss_opt.config import config_dir

            domain = load_domain(OmegaConf.load(config_dir() / "domain" / f"{dom_name}.yaml"))
            examples = domain.split("calibration")[: args.prompts]
            if len(examples) < args.prompts:
                examples += domain.split("heldout")[: args.prompts - len(examples)]
            for m in methods:
                m.tps, m.al, m.same = [], [], []
            for i, ex in enumerate(examples):
                ids = format_prompt(tok, ex, domain.config.system_prompt)
                refs: dict[str, list[int]] = {}
                if need_sparse_ref:
                    refs["sparse_greedy"] = sparse_greedy(ids, args.max_new_tokens)[0]
                # rotate the order per prompt so no method always runs first
                order = methods[i % len(methods) :] + methods[: i % len(methods)]
                outs: dict[str, list[int]] = {}
                for m in order:
                    toks, dt, al = m.run(ids, args.max_new_tokens)
                    outs[m.name] = toks
                    m.tps.append(len(toks) / dt)
                    m.al.append(al)
                refs["greedy"] = (
                    outs.get(catalogue["greedy"].name)
                    or hf_method(model, eos)(ids, args.max_new_tokens)[0]
                )
                for m in methods:
                    m.same.append(outs[m.name] == refs[m.reference])
                print(
                    f"  [{dtype} {dom_name}] prompt {i + 1}/{len(examples)} ({len(ids)} tokens) done",
                    flush=True,
                )

            base = (
                statistics.mean(catalogue["greedy"].tps)
                if catalogue["greedy"].tps
                else float("nan")
            )
            print(
                f"\n### {dom_name}, {dtype}, {len(examples)} prompts, {args.max_new_tokens} new tokens"
            )
            print(
                "| method | tok/s median | tok/s mean | ratio to HF greedy | accepted length | identical outputs |"
            )
            print("|---|---|---|---|---|---|")
            for m in methods:
                al = [a for a in m.al if a == a]
                al_s = f"{statistics.mean(al):.2f}" if al else "n/a"
                print(
                    f"| {m.name} | {statistics.median(m.tps):.2f} | {statistics.mean(m.tps):.2f} | "
                    f"{statistics.mean(m.tps) / base:.3f} | {al_s} | {sum(m.same)}/{len(m.same)} |"
                )
            print(flush=True)

        from omegaconf import OmegaConf

        from tss_opt.config import config_dir

        first = load_domain(OmegaConf.load(config_dir() / "domain" / "summarization.yaml")).split("calibration")[0]
        ids = format_prompt(tok, first, None)[:300]
        plain, ctl, ratio = overhead(model, target, ids, steps=16, rounds=args.overhead_rounds)
        print(
            f"### skip-controller overhead ({dtype}, {args.overhead_rounds} alternating pairs): untouched "
            f"{plain * 1e3:.2f} ms/step, through the skip mechanism (empty set) {ctl * 1e3:.2f} ms/step, "
            f"median pair ratio {ratio:.4f}\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
