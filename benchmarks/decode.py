"""Decoding benchmark on the embedded model: HF greedy / HF prompt lookup
against our engine with every drafter, at its shipped config and at classic fixed sizes, on short
and long prompts, eager and (``--compile``) compiled, against the memory-bandwidth limit.

    python benchmarks/decode.py --compile                          # the standing run
    python benchmarks/decode.py --prompts 2 --max-new-tokens 32 --domains summarization --lengths 64
    python benchmarks/decode.py --methods all --skip     # every fixed size too, and under a skip set

One run covers every dtype (default float32) x domain (summarization, mmlu) x prompt length
(``--lengths``, default 64 and 800 tokens: the cached context when drafting starts, where a
verified node costs 2-5 % and about 25 % of a plain step on this CPU), one table each: HF
``generate`` greedy and prompt lookup (10 tokens), our plain decoding, and ours with each
drafter at its shipped default (``_auto``: sized to the hardware
per context length, tss_opt/decoding/sizing/; pld's shipped default is the fixed chain of 10,
the search's protocol, so ``pld_auto`` is the server's default); ``--methods all`` adds the
classic fixed sizes. ``--skip`` adds every method of
ours under a domain's mapped skip set; ``--compile`` every method of ours on the compiled step.
Arms run interleaved per prompt with a rotating order, so machine drift hits them alike.
Prompts of a length: the domain's calibration prompt cut at a word boundary, or preceded by
other calibration prompts' texts until it holds the length.

Columns: decode tokens/s median over prompts (the tokens after the first over the time after it:
the prefill excluded, since no drafter or compiled step changes it, and on an 800-token prompt
it is most of a 64-token answer's time on this CPU); its ratio to HF greedy's (median over
prompts of the per-prompt ratio, both measured on that prompt side by side; HF's first token is
timed with a streamer); the same end to end (prefill included); a plain decode step's time over
the time to read the weights once (the bandwidth limit: the median of the reads timed after each
prompt's arms, so that the step and its limit see the same load);
accepted length
(committed tokens per verification, bonus included); lossless, per prompt, by the one rule of
tss_opt/decoding/lossless.py against plain greedy decoding of the same target in the same
precision (dense arms: HF greedy's tokens; skip arms: our plain decoding under the same skip
set): identical, a first divergence at a near-tie (bfloat16/float16 only: the plain run's
margin within 4 ulps of its top logit), or diverged; any "diverged" prints FAIL and the script
exits 1; target met
(the targets: every drafter >= 0.95x HF greedy on both lengths; the best >= 1.3x on summarization,
goal 1.6x; the compiled plain step within 2x of the bandwidth limit, goal 1.3x). With two
precisions (``--dtypes float32,bfloat16``) a last table per (domain, length) puts every arm
against the faster of HF's float32 and bfloat16 greedy on each prompt, with the half-precision
targets: in bfloat16 the best drafter >= 3x on the first length and >= 2.5x on the others,
every shipped drafter >= 1.2x, the compiled plain step within 1.5x of the weights' read time
(goal 1.2x); in float32 every shipped drafter >= 0.95x.

Sizing inputs: the verification-latency tables of this (machine, model, dtype, device) per
cached length are read from ``--sizing-dir`` (default storage/tree_sizing) or measured once and
cached there; the acceptance profiles (``pld``, ``samd``, ``token_recycle``, ``eagle``,
``self``) are measured per domain on ``--calibrate`` calibration prompts that the benchmark does
not decode (kept in ``<sizing-dir>/bench-<domain>/``, reused by later runs); ``--calibrate 0``
uses the priors. The EAGLE head is random unless ``--eagle-checkpoint DIR`` names a trained one:
a random head shows the plumbing and the cost, not EAGLE's acceptance.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from compiled_step import weights_read_s  # noqa: E402  (benchmarks/, the script's folder)
from transformers.generation.streamers import BaseStreamer  # noqa: E402

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.decoding.drafters import build_drafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.lossless import check_lossless  # noqa: E402
from tss_opt.decoding.sizing import CONTEXT_BUCKETS, ENV_DIR, load_or_measure_latency, save_profile  # noqa: E402
from tss_opt.decoding.sizing.measure import measure_acceptance  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402
from tss_opt.progress import progress_bar  # noqa: E402

# The arms with a drafter: key -> (label, drafter config). "_auto" = sized to the hardware
# (the shipped defaults), the others pin the classic fixed sizes.
DRAFTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "pld": ("prompt lookup, 10 tokens", {"name": "pld", "num_tokens": 10}),
    # pld's shipped default is the fixed chain of 10 (the search's protocol): auto on request.
    # auto's shipped form chooses the length per step (adapt: true); *_sized: per context length only.
    "pld_auto": ("prompt lookup, auto", {"name": "pld", "num_tokens": "auto"}),
    "pld_adapt": ("prompt lookup, auto, adapted per request", {"name": "pld", "num_tokens": "auto", "adapt": True}),
    "pld_sized": ("prompt lookup, auto, sized per context only", {"name": "pld", "num_tokens": "auto", "adapt": False}),
    "token_recycle": ("Token Recycling, 15-node template", {"name": "token_recycle", "template": "builtin:token_recycle_15.json"}),
    "token_recycle_auto": ("Token Recycling, auto", {"name": "token_recycle"}),
    # auto's shipped form gates every step on the request's own acceptance (adapt: true).
    "token_recycle_sized": ("Token Recycling, auto, sized per context only",
                            {"name": "token_recycle", "adapt": False}),
    "samd": ("SAMD, 10-token chain, 15-node fallback", {"name": "samd", "num_tokens": 10,
                                                         "template": "builtin:token_recycle_15.json"}),
    "samd_auto": ("SAMD, auto", {"name": "samd"}),
    "samd_adapt": ("SAMD, auto, match chain adapted per request", {"name": "samd", "adapt": True}),
    "samd_sized": ("SAMD, auto, sized per context only", {"name": "samd", "adapt": False}),
    "merged": ("TAPS merged (pld 10 + TR 15)", {"name": "merged", "members": [
        {"name": "pld", "num_tokens": 10}, {"name": "token_recycle", "template": "builtin:token_recycle_15.json"}]}),
    "merged_auto": ("TAPS merged, auto members", {"name": "merged", "members": [
        {"name": "pld", "num_tokens": "auto"}, {"name": "token_recycle"}]}),
    "eagle": ("EAGLE (random head), 16 tokens depth 4", {"name": "eagle", "random_init": True, "total_tokens": 16, "depth": 4}),
    "eagle_auto": ("EAGLE (random head), auto", {"name": "eagle", "random_init": True}),
    # Self-drafting under a third of the layers skipped: the model-drafted chains' sizing.
    "self": ("self-drafting (layers 10-19 skipped), 5 tokens", {"name": "self", "skip": list(range(10, 20)),
                                                                "num_tokens": 5}),
    "self_auto": ("self-drafting (layers 10-19 skipped), auto", {"name": "self", "skip": list(range(10, 20))}),
}
ALL_METHODS = ["hf_greedy", "hf_pld", "plain", *DRAFTERS]
# The standing run: every drafter at its shipped config (pld's is the fixed chain of 10, the
# search's protocol; pld_auto is the server's default), beside HF and our plain decoding.
SHIPPED = ["hf_greedy", "hf_pld", "plain", "pld", "pld_auto", "token_recycle_auto", "samd_auto", "merged_auto",
           "eagle_auto", "self_auto"]


@dataclass
class Arm:
    """One row: how it decodes, on which target, and the figures over prompts."""

    key: str
    label: str
    # -> tokens, seconds, accepted length, seconds to the first token (the prefill)
    run: Callable[[torch.Tensor, int], tuple[list[int], float, float, float]]
    skip: tuple[int, ...] = ()
    ours: bool = True
    drafter: Any = None
    tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # decode rates (prefill excluded), per prompt
    e2e_ratio: list[float] = field(default_factory=list)  # end to end (prefill included)
    decode_tps: list[float] = field(default_factory=list)
    ratio_pld: list[float] = field(default_factory=list)
    al: list[float] = field(default_factory=list)
    same: list[bool] = field(default_factory=list)  # identical to the reference's tokens
    verdicts: list[str] = field(default_factory=list)  # per prompt: identical, near_tie or diverged
    ties: list[Any] = field(default_factory=list)  # the near-ties' Divergence (margin, tolerance)


class _FirstToken(BaseStreamer):
    """Records when ``generate`` hands out its first new token (the end of its prefill): the
    first ``put`` is the prompt, the second the first generated token."""

    def __init__(self) -> None:
        self.puts, self.first = 0, float("nan")

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_run(model: Any, eos: list[int], **gen_kwargs: Any) -> Callable:
    def run(ids: torch.Tensor, n: int) -> tuple[list[int], float, float, float]:
        mark = _FirstToken()
        t0 = time.perf_counter()
        out = model.generate(ids[None], max_new_tokens=n, do_sample=False, eos_token_id=eos, streamer=mark,
                             **gen_kwargs)
        return out[0, len(ids):].tolist(), time.perf_counter() - t0, float("nan"), mark.first - t0

    return run


def engine_run(target: TargetModel, drafter: Any, eos: list[int], skip: tuple[int, ...]) -> Callable:
    # One drafter instance per arm for the whole run: Token Recycling's table stays warm across
    # prompts, as in serving.
    def run(ids: torch.Tensor, n: int) -> tuple[list[int], float, float, float]:
        eng = SpeculativeEngine(target, drafter, eos_token_ids=eos)
        t0 = time.perf_counter()
        res = eng.generate(ids, max_new_tokens=n, skip=skip)
        return res.tokens.tolist(), time.perf_counter() - t0, res.stats.accept_length, res.stats.prefill_s

    return run


def mapped_skip(mapping: Path, domain: str) -> tuple[int, ...]:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(mapping), resolve=True)
    try:
        return tuple(int(x) for x in data["domains"][domain]["skip_set"])  # type: ignore[index]
    except (KeyError, TypeError) as e:
        raise SystemExit(f"--mapping {mapping}: no domains.{domain}.skip_set ({e}); give a mapping file with it") from e


def calibrate(rt: Any, directory: Path, prompts: list[torch.Tensor], new_tokens: int) -> list[str]:
    """Measure the pld, samd, self, token_recycle and eagle acceptance profiles on ``prompts`` (wide trees
    so every depth and rank is tried) into ``directory``, unless already there."""
    from tss_opt.decoding.drafter import NoDrafter
    from tss_opt.decoding.drafters.draft_model import SelfDrafter
    from tss_opt.decoding.drafters.eagle import EagleDrafter
    from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
    from tss_opt.decoding.drafters.sam import SamdDrafter
    from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter

    lines = []
    wide = {
        "pld": lambda: PromptLookupDrafter(num_tokens=10),
        "samd": lambda: SamdDrafter(num_tokens=10, fallback=NoDrafter()),  # the match chain alone
        "self": lambda: SelfDrafter(rt.target.model, skip=DRAFTERS["self"][1]["skip"], num_tokens=8,
                                    layers_path=rt.loaded.config.layers_path),
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
                                  max_depth=10 if name in ("pld", "samd") else 8, name=f"{name} measured")
        save_profile(prof, name, directory)
        rows = "; ".join(f"d{d + 1}: " + " ".join(f"{p:.2f}" for p in row[:4]) for d, row in enumerate(prof.rank_accept[:4]))
        lines.append(f"profile {name}: measured in {time.perf_counter() - t0:.0f} s on {len(prompts)} prompts "
                     f"(proposes at {prof.proposal_rate:.0%} of steps; {rows} ...)")
    return lines


def choices(d: Any) -> list[str]:
    """What a sized drafter chose: its choice per context bucket and its per-request rule
    (Token Recycling has both: a tree per bucket, gated per step), else its one tree."""
    out = [d.sizer.describe()] if getattr(d, "sizer", None) is not None else []
    if getattr(d, "online", None) is not None:
        out.append(d.online.describe())
    if out:
        return out
    ch = getattr(d, "choice", None) or getattr(getattr(d, "fallback", None), "choice", None)
    return [ch.describe()] if ch is not None else []


def across_precisions(collected: dict[tuple[str, int], dict[str, tuple[list[Arm], float]]], lengths: list[int]) -> list[str]:
    """Every arm of every precision against the faster of transformers' float32 and bfloat16
    greedy on each prompt (its bfloat16 path is not always the faster one on a CPU), with the
    half-precision targets: in bfloat16 the best drafter >= 3x on the first (short) length and
    >= 2.5x on the others, every shipped drafter >= 1.2x, the compiled plain step within 1.5x
    of its weights' read time (goal 1.2x); in float32 every shipped drafter >= 0.95x. Prints the
    table and returns the summary lines."""
    lines: list[str] = []
    for (dom, length), by_dtype in collected.items():
        hf = {d: next((a for a in arms if a.key == "hf_greedy"), None) for d, (arms, _) in by_dtype.items()}
        if len(by_dtype) < 2 or any(a is None for a in hf.values()):
            continue
        per_prompt = [max(x) for x in zip(*(a.decode_tps for a in hf.values()))]  # type: ignore[union-attr]
        short = length == lengths[0]
        print(f"\n### {dom}, prompts of length {length or 'the domain’s own'}: every precision against the faster "
              f"HF greedy per prompt ({', '.join(by_dtype)})\n")
        print("| precision | method | target | decode tok/s | ratio to the faster HF greedy | target met |")
        print("|---|---|---|---|---|---|")
        for dtype, (arms, read_s) in by_dtype.items():
            drafted = [a for a in arms if a.drafter is not None and not a.skip]
            for a in arms:
                r = _median([x / y for x, y in zip(a.decode_tps, per_prompt)])
                bar = 1.2 if dtype in ("bfloat16", "float16") else 0.95
                met = "-" if a.drafter is None or a.skip else ("yes" if r >= bar else f"NO: < {bar}x")
                print(f"| {dtype} | {a.label} | {'skip ' + str(list(a.skip)) if a.skip else 'dense'} | "
                      f"{_median(a.decode_tps):.2f} | {r:.3f} | {met} |")
            if not drafted:
                continue
            ratios = {a.label: _median([x / y for x, y in zip(a.decode_tps, per_prompt)]) for a in drafted}
            best = max(ratios, key=ratios.__getitem__)
            half = dtype in ("bfloat16", "float16")
            bar = 1.2 if half else 0.95
            slow = [k for k, r in ratios.items() if r < bar]
            line = (f"{dtype} {dom} length {length} against the faster HF greedy: best {best} {ratios[best]:.2f}x"
                    + (f" (target >= {3.0 if short else 2.5}x: {'met' if ratios[best] >= (3.0 if short else 2.5) else 'NOT met'})" if half else "")
                    + f"; drafters >= {bar}x: {len(ratios) - len(slow)}/{len(ratios)}"
                    + (f" (below: {', '.join(slow)})" if slow else ""))
            for a in arms:
                if a.key == "plain@compiled":
                    x = 1 / _median(a.decode_tps) / read_s
                    bound = " (target <= 1.5x, goal 1.2x: " + ("met" if x <= 1.5 else "NOT met") + ")" if half else ""
                    line += f"; compiled plain step {x:.2f}x the bandwidth limit{bound}"
            print(f"\n{line}", flush=True)
            lines.append(line)
    return lines


def _median(xs: list[float]) -> float:
    """The median of the prompts that have the figure (a one-token answer has no decode rate)."""
    ok = [x for x in xs if x == x]
    return statistics.median(ok) if ok else float("nan")


def target_cell(a: Arm) -> str:
    """The per-arm target: every drafter >= 0.95x HF greedy (and our prompt lookup >=
    1.0x HF's), outputs identical."""
    if not a.ours or a.key.startswith("plain"):
        return "-"
    r = _median(a.ratio)
    miss = []
    if r < 0.95:
        miss.append(f"{r:.2f}x < 0.95x greedy")
    if a.key.split("@")[0] in ("pld", "pld_auto", "pld_adapt", "pld_sized") and a.ratio_pld and _median(a.ratio_pld) < 1.0:
        miss.append(f"{_median(a.ratio_pld):.2f}x < 1.0x HF PLD")
    if "diverged" in a.verdicts:
        miss.append("outputs diverge (not at a near-tie)")
    return "yes" if not miss else "NO: " + ", ".join(miss)


def at_length(tok: Any, domain: Any, ex: Any, pool: list[Any], length: int) -> torch.Tensor:
    """``ex``'s prompt with about ``length`` tokens once formatted (0: as it is): its text cut at
    a word boundary (keeping the start, where the instruction is) when longer, else preceded by
    the texts of other examples of the pool (``pool``, in order) until it holds ``length``."""
    sys_prompt = domain.config.system_prompt

    def fmt(text: str) -> torch.Tensor:
        return format_prompt(tok, dataclasses.replace(ex, prompt=text), sys_prompt)

    ids = fmt(ex.prompt)
    if length <= 0 or len(ids) == length:
        return ids
    if len(ids) > length:
        words = ex.prompt.split(" ")
        lo, hi = 1, len(words)  # the most words whose prompt fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(fmt(" ".join(words[:mid]))) <= length:
                lo = mid
            else:
                hi = mid - 1
        return fmt(" ".join(words[:lo]))
    text = ex.prompt
    for other in pool:
        if other.id == ex.id:
            continue
        text = f"{other.prompt}\n\n{text}"
        ids = fmt(text)
        if len(ids) >= length:
            break
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default="summarization,mmlu")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--lengths", default="64,800",
                    help="prompt lengths in tokens (the cached context when drafting starts); 0: the domain's own")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", default=",".join(SHIPPED),
                    help=f"comma-separated, or 'all' ({', '.join(ALL_METHODS)})")
    ap.add_argument("--compile", action="store_true",
                    help="also every method of ours on the compiled step (compile=true), beside eager")
    ap.add_argument("--skip-domain", default="mmlu", help="whose mapped skip set the skip arms use")
    ap.add_argument("--mapping", type=Path, default=REPO / "docs" / "results" / "mapping_cpu_preset.yaml")
    ap.add_argument("--skip", action="store_true", help="also every method of ours under the mapped skip set")
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
    wanted = ALL_METHODS if args.methods == "all" else args.methods.split(",")
    unknown = sorted(set(wanted) - set(ALL_METHODS))
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; available: {', '.join(ALL_METHODS)} (or all)")
    skip = mapped_skip(args.mapping, args.skip_domain) if args.skip else ()
    lengths = [int(x) for x in args.lengths.split(",")]
    t_run = time.perf_counter()
    print(f"# decode benchmark: {torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
          f"{args.prompts} prompts x {args.max_new_tokens} new tokens per (domain, length), lengths {lengths}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
          + (f"; skip arms: {args.skip_domain}'s mapped skip set {list(skip)} ({args.mapping.name})" if skip else ""),
          flush=True)
    summary: list[str] = []
    failures: list[str] = []  # lossless violations: the run exits 1
    # (domain, length) -> dtype -> (arms, weights' read seconds): the comparison across precisions
    collected: dict[tuple[str, int], dict[str, tuple[list[Arm], float]]] = {}
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir

    for dtype in args.dtypes.split(","):
        rt = assemble(compose_config([f"dtype={dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]))
        target, model, tok = rt.target, rt.loaded.model, rt.loaded.tokenizer
        targets = {"eager": target}
        if args.compile:
            from tss_opt.decoding.compiled import CompiledTarget

            cfg_m = rt.loaded.config
            targets["compiled"] = CompiledTarget(model, layers_path=cfg_m.layers_path, max_context=cfg_m.max_context)
        eos = list(rt.eos_token_ids)
        base = args.sizing_dir
        t0 = time.perf_counter()
        for tgt in targets.values():  # once here, not once per domain folder (the compiled step has its own)
            for ctx in CONTEXT_BUCKETS:
                load_or_measure_latency(tgt, base, prefix_len=ctx)
        table = load_or_measure_latency(target, base)
        load = table.describe_host()
        read_s = weights_read_s(model)  # the bandwidth limit, as benchmarks/compiled_step.py measures it
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"\n## {dtype}: latency table after 64 tokens ({table.measured_at}, {load}{', BUSY' if table.busy else ''}, "
              f"{time.perf_counter() - t0:.1f} s to read or measure): "
              + ", ".join(f"{n}: {s * 1e3:.0f} ms" for n, s in sorted(table.seconds.items())), flush=True)
        print(f"bandwidth limit: the weights ({nbytes / 1e6:.0f} MB) read once in {read_s * 1e3:.1f} ms "
              f"(median of 7 sums of every parameter; {nbytes / read_s / 1e9:.1f} GB/s): at most {1 / read_s:.1f} tokens/s for a plain step"
              " (the tables use the reads timed beside their arms)",
              flush=True)
        for dom_name in args.domains.split(","):
            domain = load_domain(OmegaConf.load(config_dir() / "domain" / f"{dom_name}.yaml"))
            cal = domain.split("calibration")
            examples = cal[: args.prompts]
            calib = cal[args.prompts: args.prompts + args.calibrate]
            # Per-domain profiles beside a copy of this hardware's latency tables and draft costs.
            ddir = base / f"bench-{dom_name}"
            ddir.mkdir(parents=True, exist_ok=True)
            for f in [*base.glob("latency-*.json"), *base.glob("draft-*.json")]:
                shutil.copy(f, ddir / f.name)
            os.environ[ENV_DIR] = str(ddir)
            notes = []
            if calib:
                notes = calibrate(rt, ddir, [format_prompt(tok, ex, domain.config.system_prompt) for ex in calib],
                                  args.calibrate_tokens or args.max_new_tokens)
            specs: list[Arm] = []  # one per method; each length gets fresh figures
            for mode, tgt in targets.items():
                mtag = "" if mode == "eager" else ", compiled"
                for sk in [(), skip] if skip else [()]:
                    tag = (f"@skip{list(sk)}" if sk else "") + ("" if mode == "eager" else "@compiled")
                    for key in wanted:
                        if key in ("hf_greedy", "hf_pld"):
                            if sk or mode != "eager":
                                continue
                            kw = {"prompt_lookup_num_tokens": 10} if key == "hf_pld" else {}
                            label = "HF greedy generate" if key == "hf_greedy" else "HF prompt lookup (10)"
                            specs.append(Arm(key, label, hf_run(model, eos, **kw), ours=False))
                        elif key == "plain":
                            specs.append(Arm("plain" + tag, f"ours: plain decoding{mtag}", engine_run(tgt, None, eos, sk), sk))
                        else:
                            label, over = DRAFTERS[key]
                            # The shipped config (conf/drafter/<name>.yaml) with the arm's settings.
                            cfg = OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / f"{over['name']}.yaml"), over)
                            d = build_drafter(cfg, tgt, rt.loaded)
                            specs.append(Arm(key + tag, f"ours: {label}{mtag}", engine_run(tgt, d, eos, sk), sk, drafter=d))
                            if not sk:  # the compiled step has its own tables, so its own choices
                                notes += [f"{key}{mtag}: {c}" for c in choices(d)]
                                for lab, m in getattr(d, "members", []) or []:
                                    notes += [f"{key}{mtag} member {lab}: {c}" for c in choices(m)]
                    if sk and not any(a.key == f"plain{tag}" for a in specs):
                        specs.append(Arm(f"plain{tag}", f"ours: plain decoding{mtag}", engine_run(tgt, None, eos, sk), sk))
            for n in notes:
                print(f"- {n}")
            for length in lengths:
                arms = [Arm(a.key, a.label, a.run, a.skip, a.ours, a.drafter) for a in specs]
                prompts = [at_length(tok, domain, ex, cal, length) for ex in examples]
                # The compiled arms compile their graphs (a slot bucket, a new window length)
                # the first time they meet them: once, untimed, on this length's first prompt.
                for a in arms:
                    if a.key.endswith("@compiled"):
                        a.run(prompts[0], args.max_new_tokens)
                t_dom = time.perf_counter()
                # The weights' read time again after every prompt's arms, so the step and its
                # bandwidth limit are measured under the same load (one figure at the start was
                # once 14.1 ms against 10.2-11.3 ms in every other run).
                reads: list[float] = []
                bar = progress_bar(len(prompts), f"{dtype} {dom_name} {length}", unit="prompt", leave=False)
                for i, ids in enumerate(prompts):
                    order = arms[i % len(arms):] + arms[: i % len(arms)]
                    # key -> (tokens, end-to-end tokens/s, decode tokens/s: after the first token)
                    outs: dict[str, tuple[list[int], float, float]] = {}
                    for a in order:
                        toks, dt, al, first = a.run(ids, args.max_new_tokens)
                        # an answer of one token (EOS at once) has no decode rate
                        dec = (len(toks) - 1) / (dt - first) if len(toks) > 1 else float("nan")
                        outs[a.key] = (toks, len(toks) / dt, dec)
                        a.al.append(al)
                    reads.append(weights_read_s(model, repeats=3))
                    if "hf_greedy" not in outs:
                        outs["hf_greedy"] = (hf_run(model, eos)(ids, args.max_new_tokens)[0], float("nan"), float("nan"))
                    for a in arms:
                        toks, tps, dec = outs[a.key]
                        ref = outs["hf_greedy"][0] if not a.skip else outs[f"plain@skip{list(a.skip)}"][0]
                        a.tps.append(tps)
                        a.decode_tps.append(dec)
                        a.same.append(toks == ref)
                        # The one lossless rule: the margin at a divergence from the eager
                        # target (the compiled step computes the same model).
                        check = check_lossless(target, ids, ref, toks, a.skip)
                        a.verdicts.append(check.verdict)
                        if check.verdict == "near_tie":
                            a.ties.append(check.divergence)
                        a.ratio.append(dec / outs["hf_greedy"][2] if outs["hf_greedy"][2] > 0 else float("nan"))
                        a.e2e_ratio.append(tps / outs["hf_greedy"][1])
                        if "hf_pld" in outs and outs["hf_pld"][2] > 0:
                            a.ratio_pld.append(dec / outs["hf_pld"][2])
                    bar.update(1)
                bar.close()
                ctx = statistics.median(len(p) for p in prompts)
                read_here = statistics.median(reads)
                print(f"\n### {dom_name}, {dtype}, prompts of {ctx:.0f} tokens (median), {len(prompts)} prompts x "
                      f"{args.max_new_tokens} new tokens ({time.perf_counter() - t_dom:.0f} s); the weights read in "
                      f"{read_here * 1e3:.1f} ms here (median of {len(reads)}, one after each prompt's arms)")
                print("\n| method | target | decode tok/s | ratio to HF greedy (decode) | end-to-end tok/s "
                      "| ratio (end to end) | step vs bandwidth limit | accepted length | identical | near-tie "
                      "| diverged | target met |")
                print("|---|---|---|---|---|---|---|---|---|---|---|---|")
                for a in arms:
                    al = [x for x in a.al if x == x]
                    # A plain step's time over the weights' read time (target: compiled within 2x, goal 1.3x).
                    bw = (f"{1 / _median(a.decode_tps) / read_here:.2f}x"
                          if a.key.split("@")[0] in ("plain", "hf_greedy") else "-")
                    print(f"| {a.label} | {'skip ' + str(list(a.skip)) if a.skip else 'dense'} | "
                          f"{_median(a.decode_tps):.2f} | {_median(a.ratio):.3f} | "
                          f"{statistics.median(a.tps):.2f} | {statistics.median(a.e2e_ratio):.3f} | {bw} | "
                          f"{statistics.mean(al) if al else float('nan'):.2f} | "
                          f"{a.verdicts.count('identical')}/{len(a.verdicts)} | {a.verdicts.count('near_tie')} | "
                          f"{a.verdicts.count('diverged')} | {target_cell(a)} |")
                    if "diverged" in a.verdicts:
                        failures.append(f"{dtype} {dom_name} {length}: {a.label} diverged from plain greedy on "
                                        f"{a.verdicts.count('diverged')}/{len(a.verdicts)} prompts (not at a near-tie)")
                ties = [d for a in arms for d in a.ties]
                if ties:  # how close the near-ties were: margins well inside the tolerance are real ties
                    print(f"\nnear-ties: {len(ties)}; the plain target's margin there {min(d.margin for d in ties):.4g} to "
                          f"{max(d.margin for d in ties):.4g} logits, tolerance (4 ulps of the top logit) "
                          f"{min(d.tolerance for d in ties):.3g} to {max(d.tolerance for d in ties):.3g}")
                drafted = [a for a in arms if a.drafter is not None]
                if drafted:
                    best = max(drafted, key=lambda a: _median(a.ratio))
                    r = _median(best.ratio)
                    goal = "" if dom_name != "summarization" else (
                        f"; best >= 1.3x (summarization): {'met' if r >= 1.3 else 'NOT met'} (goal 1.6x)")
                    e2e = statistics.median(best.e2e_ratio)
                    slow = [a.label for a in drafted if _median(a.ratio) < 0.95]
                    line = (f"{dtype} {dom_name} {ctx:.0f}-token prompts (decode rates): best {best.label} "
                            f"({'skip' if best.skip else 'dense'}) {r:.2f}x HF greedy ({e2e:.2f}x end to end){goal}; "
                            "drafters >= 0.95x: "
                            f"{len(drafted) - len(slow)}/{len(drafted)}" + (f" (below: {', '.join(slow)})" if slow else ""))
                    plains = [a for a in arms if a.key.split("@")[0] == "plain" and not a.skip]
                    for a in plains:
                        x = 1 / _median(a.decode_tps) / read_here
                        line += f"; {a.label.removeprefix('ours: ')} step {x:.2f}x the bandwidth limit"
                    print(f"\n{line}\n", flush=True)
                    summary.append(line)
                collected.setdefault((dom_name, length), {})[dtype] = (arms, read_here)
        del rt, target, model, targets
    summary += across_precisions(collected, lengths)
    print("## summary")
    for line in summary:
        print(f"- {line}")
    for line in failures:
        print(f"FAIL: {line}")
    print(f"\ntotal {time.perf_counter() - t_run:.0f} s", flush=True)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
