"""Decoding benchmark on the embedded model (issue 23): HF greedy / HF prompt lookup against our
engine with every drafter, fixed and sized to the hardware, dense and under a mapped skip set.

    python benchmarks/decode.py                                   # the issue's run (below)
    python benchmarks/decode.py --prompts 2 --max-new-tokens 32 --dtypes float32 --domains summarization
    python benchmarks/decode.py --methods hf_greedy,hf_pld,pld,pld_auto   # a subset

One run covers every dtype (float32, bfloat16) x domain (summarization, mmlu) and, in one table
per (dtype, domain), every arm on the dense target and under mmlu's mapped skip set
(``--mapping``, default docs/results/mapping_cpu_preset.yaml): HF ``generate`` greedy and prompt
lookup (10 tokens), our plain decoding, and ours with each drafter fixed (its classic size) and
``auto`` (sized to the hardware, tss_opt/decoding/tree_sizing.py). Arms run interleaved per
prompt with a rotating order, so machine drift hits them alike.

Columns: tokens/s median over prompts; ratio to HF greedy (median over prompts of the per-prompt
ratio, both measured on that prompt side by side); accepted length (committed tokens per
verification, bonus included); identical outputs (dense arms: equal to HF greedy's tokens; skip
arms: equal to our plain decoding under the same skip set); target met (issue 23: every drafter
>= 0.95x HF greedy; our prompt lookup >= 1.0x HF prompt lookup; below the table: the best arm
>= 1.15x).

Sizing inputs: the verification-latency table of this (machine, model, dtype, device) is read
from ``--sizing-dir`` (default storage/tree_sizing) or measured once and cached there; the
acceptance profiles (``pld``, ``token_recycle``, ``eagle``) are measured per domain on
``--calibrate`` calibration prompts that the benchmark does not decode (kept in
``<sizing-dir>/bench-<domain>/``, reused by later runs); ``--calibrate 0`` uses the priors.
The EAGLE head is random unless ``--eagle-checkpoint DIR`` names a trained one (then the eagle
arms and the eagle profile use it): a random head shows the plumbing and the cost, not EAGLE's
acceptance.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.decoding.drafters import build_drafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.decoding.tree_sizing import (  # noqa: E402
    ENV_DIR,
    load_or_measure_latency,
    measure_acceptance,
    save_profile,
)
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402
from tss_opt.progress import progress_bar  # noqa: E402

# The arms with a drafter: key -> (label, drafter config). "_auto" = sized to the hardware
# (the shipped defaults), the others pin the classic fixed sizes.
DRAFTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "pld": ("prompt lookup, 10 tokens", {"name": "pld", "num_tokens": 10}),
    # pld's shipped default is the fixed chain of 10 (the search's protocol): auto on request.
    "pld_auto": ("prompt lookup, auto", {"name": "pld", "num_tokens": "auto"}),
    "token_recycle": ("Token Recycling, 15-node template", {"name": "token_recycle", "template": "builtin:token_recycle_15.json"}),
    "token_recycle_auto": ("Token Recycling, auto", {"name": "token_recycle"}),
    "samd": ("SAMD, 15-node fallback", {"name": "samd", "template": "builtin:token_recycle_15.json"}),
    "samd_auto": ("SAMD, auto fallback", {"name": "samd"}),
    "merged": ("TAPS merged (pld 10 + TR 15)", {"name": "merged", "members": [
        {"name": "pld", "num_tokens": 10}, {"name": "token_recycle", "template": "builtin:token_recycle_15.json"}]}),
    "merged_auto": ("TAPS merged, auto members", {"name": "merged", "members": [
        {"name": "pld", "num_tokens": "auto"}, {"name": "token_recycle"}]}),
    "eagle": ("EAGLE (random head), 16 tokens depth 4", {"name": "eagle", "random_init": True, "total_tokens": 16, "depth": 4}),
    "eagle_auto": ("EAGLE (random head), auto", {"name": "eagle", "random_init": True}),
}
DEFAULT_METHODS = ["hf_greedy", "hf_pld", "plain", *DRAFTERS]


@dataclass
class Arm:
    """One row: how it decodes, on which target, and the figures over prompts."""

    key: str
    label: str
    run: Callable[[torch.Tensor, int], tuple[list[int], float, float]]  # -> tokens, seconds, accepted length
    skip: tuple[int, ...] = ()
    ours: bool = True
    drafter: Any = None
    tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    ratio_pld: list[float] = field(default_factory=list)
    al: list[float] = field(default_factory=list)
    same: list[bool] = field(default_factory=list)


def hf_run(model: Any, eos: list[int], **gen_kwargs: Any) -> Callable:
    def run(ids: torch.Tensor, n: int) -> tuple[list[int], float, float]:
        t0 = time.perf_counter()
        out = model.generate(ids[None], max_new_tokens=n, do_sample=False, eos_token_id=eos, **gen_kwargs)
        return out[0, len(ids):].tolist(), time.perf_counter() - t0, float("nan")

    return run


def engine_run(target: TargetModel, drafter: Any, eos: list[int], skip: tuple[int, ...]) -> Callable:
    # One drafter instance per arm for the whole run: Token Recycling's table stays warm across
    # prompts, as in serving.
    def run(ids: torch.Tensor, n: int) -> tuple[list[int], float, float]:
        eng = SpeculativeEngine(target, drafter, eos_token_ids=eos)
        t0 = time.perf_counter()
        res = eng.generate(ids, max_new_tokens=n, skip=skip)
        return res.tokens.tolist(), time.perf_counter() - t0, res.stats.accept_length

    return run


def mapped_skip(mapping: Path, domain: str) -> tuple[int, ...]:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(mapping), resolve=True)
    try:
        return tuple(int(x) for x in data["domains"][domain]["skip_set"])  # type: ignore[index]
    except (KeyError, TypeError) as e:
        raise SystemExit(f"--mapping {mapping}: no domains.{domain}.skip_set ({e}); give a mapping file with it") from e


def calibrate(rt: Any, directory: Path, prompts: list[torch.Tensor], new_tokens: int) -> list[str]:
    """Measure the pld, token_recycle and eagle acceptance profiles on ``prompts`` (wide trees
    so every depth and rank is tried) into ``directory``, unless already there."""
    from tss_opt.decoding.drafters.eagle import EagleDrafter
    from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
    from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter

    lines = []
    wide = {
        "pld": lambda: PromptLookupDrafter(num_tokens=10),
        "token_recycle": lambda: TokenRecycleDrafter("builtin:token_recycle_large.json", top_k=8),
        "eagle": lambda: EagleDrafter(build_drafter({**DRAFTERS["eagle"][1], "total_tokens": 16},
                                                    rt.target, rt.loaded).head, total_tokens=40, depth=5, top_k=8),
    }
    for name, make in wide.items():
        path = directory / f"profile-{name}.json"
        if path.is_file():
            lines.append(f"profile {name}: cached ({path})")
            continue
        t0 = time.perf_counter()
        prof = measure_acceptance(rt.target, make(), prompts, max_new_tokens=new_tokens,
                                  max_depth=10 if name == "pld" else 8, name=f"{name} measured")
        save_profile(prof, name, directory)
        rows = "; ".join(f"d{d + 1}: " + " ".join(f"{p:.2f}" for p in row[:4]) for d, row in enumerate(prof.rank_accept[:4]))
        lines.append(f"profile {name}: measured in {time.perf_counter() - t0:.0f} s on {len(prompts)} prompts "
                     f"(proposes at {prof.proposal_rate:.0%} of steps; {rows} ...)")
    return lines


def choices(d: Any) -> list[str]:
    """What a sized drafter chose: pld's chain per context bucket, else its one tree."""
    if getattr(d, "sizer", None) is not None:
        return [d.sizer.describe()]
    ch = getattr(d, "choice", None) or getattr(getattr(d, "fallback", None), "choice", None)
    return [ch.describe()] if ch is not None else []


def target_cell(a: Arm, best_needed: bool = False) -> str:
    if not a.ours or a.key.startswith("plain"):
        return "-"
    r = statistics.median(a.ratio)
    miss = []
    if r < 0.95:
        miss.append(f"{r:.2f}x < 0.95x greedy")
    if a.key.split("@")[0] in ("pld", "pld_auto") and a.ratio_pld and statistics.median(a.ratio_pld) < 1.0:
        miss.append(f"{statistics.median(a.ratio_pld):.2f}x < 1.0x HF PLD")
    if not all(a.same):
        miss.append("outputs differ")
    return "yes" if not miss else "NO: " + ", ".join(miss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default="summarization,mmlu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--skip-domain", default="mmlu", help="whose mapped skip set the skip arms use")
    ap.add_argument("--mapping", type=Path, default=REPO / "docs" / "results" / "mapping_cpu_preset.yaml")
    ap.add_argument("--no-skip", action="store_true", help="dense arms only")
    ap.add_argument("--calibrate", type=int, default=2, help="calibration prompts per domain for the profiles (0: priors)")
    ap.add_argument("--calibrate-tokens", type=int, default=None,
                    help="new tokens per calibration prompt (default: --max-new-tokens, so the profile sees the same depth of each answer)")
    ap.add_argument("--sizing-dir", type=Path, default=REPO / "storage" / "tree_sizing")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eagle-checkpoint", default=None,
                    help="a trained EAGLE head directory for the eagle arms (default: a random head)")
    args = ap.parse_args()
    if args.eagle_checkpoint:  # the eagle arms (and the eagle profile) use the trained head
        for key in ("eagle", "eagle_auto"):
            label, over = DRAFTERS[key]
            over = {k: v for k, v in over.items() if k != "random_init"}
            DRAFTERS[key] = (label.replace("random head", "trained head"), {**over, "checkpoint": args.eagle_checkpoint})
    torch.set_num_threads(args.threads)
    wanted = args.methods.split(",")
    unknown = sorted(set(wanted) - set(DEFAULT_METHODS))
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; available: {', '.join(DEFAULT_METHODS)}")
    skip = () if args.no_skip else mapped_skip(args.mapping, args.skip_domain)
    t_run = time.perf_counter()
    print(f"# decode benchmark: {torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
          f"{args.prompts} calibration prompts x {args.max_new_tokens} new tokens per domain; "
          f"skip arms: {args.skip_domain}'s mapped skip set {list(skip)} ({args.mapping.name})", flush=True)
    summary: list[str] = []
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir

    for dtype in args.dtypes.split(","):
        rt = assemble(compose_config([f"dtype={dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]))
        target, model, tok = rt.target, rt.loaded.model, rt.loaded.tokenizer
        eos = list(rt.eos_token_ids)
        base = args.sizing_dir
        t0 = time.perf_counter()
        table = load_or_measure_latency(target, base)
        load = "load not recorded" if table.load is None else f"load {table.load} on {table.cpus} CPUs"
        print(f"\n## {dtype}: latency table ({table.measured_at}, {load}{', BUSY' if table.busy else ''}, "
              f"{time.perf_counter() - t0:.1f} s to read or measure): "
              + ", ".join(f"{n}: {s * 1e3:.0f} ms" for n, s in sorted(table.seconds.items())), flush=True)
        for dom_name in args.domains.split(","):
            domain = load_domain(OmegaConf.load(config_dir() / "domain" / f"{dom_name}.yaml"))
            cal = domain.split("calibration")
            examples = cal[: args.prompts]
            calib = cal[args.prompts: args.prompts + args.calibrate]
            # Per-domain profiles beside a copy of this hardware's latency table and draft costs.
            ddir = base / f"bench-{dom_name}"
            ddir.mkdir(parents=True, exist_ok=True)
            for f in [*base.glob("latency-*.json"), *base.glob("draft-*.json")]:
                shutil.copy(f, ddir / f.name)
            os.environ[ENV_DIR] = str(ddir)
            notes = []
            if calib:
                notes = calibrate(rt, ddir, [format_prompt(tok, ex, domain.config.system_prompt) for ex in calib],
                                  args.calibrate_tokens or args.max_new_tokens)
            arms: list[Arm] = []
            for sk in [(), skip] if skip else [()]:
                tag = f"@skip{list(sk)}" if sk else ""
                for key in wanted:
                    if key in ("hf_greedy", "hf_pld"):
                        if sk:
                            continue
                        kw = {"prompt_lookup_num_tokens": 10} if key == "hf_pld" else {}
                        label = "HF greedy generate" if key == "hf_greedy" else "HF prompt lookup (10)"
                        arms.append(Arm(key, label, hf_run(model, eos, **kw), ours=False))
                    elif key == "plain":
                        arms.append(Arm("plain" + tag, "ours: plain decoding", engine_run(target, None, eos, sk), sk))
                    else:
                        label, over = DRAFTERS[key]
                        # The shipped config (conf/drafter/<name>.yaml) with the arm's settings.
                        cfg = OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / f"{over['name']}.yaml"), over)
                        d = build_drafter(cfg, target, rt.loaded)
                        arms.append(Arm(key + tag, f"ours: {label}", engine_run(target, d, eos, sk), sk, drafter=d))
                        if not sk:
                            notes += [f"{key}: {c}" for c in choices(d)]
                            for lab, m in getattr(d, "members", []) or []:
                                notes += [f"{key} member {lab}: {c}" for c in choices(m)]
            if sk := skip:
                if not any(a.key == f"plain@skip{list(sk)}" for a in arms):
                    arms.append(Arm(f"plain@skip{list(sk)}", "ours: plain decoding", engine_run(target, None, eos, sk), sk))
            t_dom = time.perf_counter()
            bar = progress_bar(len(examples), f"{dtype} {dom_name}", unit="prompt", leave=False)  # terminal only
            for i, ex in enumerate(examples):
                ids = format_prompt(tok, ex, domain.config.system_prompt)
                order = arms[i % len(arms):] + arms[: i % len(arms)]
                outs: dict[str, tuple[list[int], float]] = {}
                for a in order:
                    toks, dt, al = a.run(ids, args.max_new_tokens)
                    outs[a.key] = (toks, len(toks) / dt)
                    a.al.append(al)
                if "hf_greedy" not in outs:
                    outs["hf_greedy"] = (hf_run(model, eos)(ids, args.max_new_tokens)[0], float("nan"))
                for a in arms:
                    toks, tps = outs[a.key]
                    ref = outs["hf_greedy"][0] if not a.skip else outs[f"plain@skip{list(a.skip)}"][0]
                    a.tps.append(tps)
                    a.same.append(toks == ref)
                    a.ratio.append(tps / outs["hf_greedy"][1])
                    if "hf_pld" in outs:
                        a.ratio_pld.append(tps / outs["hf_pld"][1])
                bar.update(1)
            bar.close()
            print(f"\n### {dom_name}, {dtype}, {len(examples)} prompts x {args.max_new_tokens} new tokens "
                  f"({time.perf_counter() - t_dom:.0f} s)")
            for n in notes:
                print(f"- {n}")
            print("\n| method | target | tok/s median | ratio to HF greedy | accepted length | identical outputs | target met |")
            print("|---|---|---|---|---|---|---|")
            for a in arms:
                al = [x for x in a.al if x == x]
                print(f"| {a.label} | {'skip ' + str(list(a.skip)) if a.skip else 'dense'} | "
                      f"{statistics.median(a.tps):.2f} | {statistics.median(a.ratio):.3f} | "
                      f"{statistics.mean(al):.2f} | {sum(a.same)}/{len(a.same)} | {target_cell(a)} |"
                      if al else
                      f"| {a.label} | dense | {statistics.median(a.tps):.2f} | {statistics.median(a.ratio):.3f} | "
                      f"n/a | {sum(a.same)}/{len(a.same)} | - |")
            drafted = [a for a in arms if a.drafter is not None]
            if drafted:
                best = max(drafted, key=lambda a: statistics.median(a.ratio))
                r = statistics.median(best.ratio)
                line = (f"{dtype} {dom_name}: best drafter {best.label} ({'skip' if best.skip else 'dense'}) "
                        f"{r:.2f}x HF greedy: target >= 1.15x {'met' if r >= 1.15 else 'NOT met'}; "
                        f"drafters >= 0.95x: {sum(statistics.median(a.ratio) >= 0.95 for a in drafted)}/{len(drafted)}")
                print(f"\n{line}\n", flush=True)
                summary.append(line)
        del rt, target, model
    print("## summary")
    for line in summary:
        print(f"- {line}")
    print(f"\ntotal {time.perf_counter() - t_run:.0f} s", flush=True)


if __name__ == "__main__":
    main()
