"""Relaxed verification on the embedded model: exact vs DIVERSED (searched and learned
weight) vs CoSpec (threshold and learned), each dense and with a TSS skip set, on held-out
prompts; settings chosen on calibration prompts.

Per domain the settings are tuned on the calibration prompts under the TSS skip set, as
``python -m tss_opt.cli.tune_verification`` does (:func:`tss_opt.training.relaxed_choice.tune_relaxed`,
paired metric rule against dense exact): DIVERSED's grid of fixed weights and its learned,
context-dependent weight; CoSpec's threshold rule and its learned policy. Then every method
runs the held-out prompts. LOSSY rows show their metric change beside their speedup.

The drafter must give a distribution: ``--drafter self`` (the target under ``--draft-skip``;
fewer skipped layers make the draft match the target more often) or ``--drafter eagle
--checkpoint DIR`` (an EAGLE-1 head directory, config.json + pytorch_model.bin; ``random`` for a
random head: plumbing only).

    OMP_NUM_THREADS=1 python benchmarks/relaxed.py --domains summarization,qa --out docs/results/relaxed_benchmark.txt
    OMP_NUM_THREADS=1 python benchmarks/relaxed.py --drafter eagle --checkpoint storage/eagle/smollm2 --domains summarization
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.assembly import assemble, build_evaluator, compose_config, prompt_set  # noqa: E402
from tss_opt.config.schema import RelaxedSettings  # noqa: E402
from tss_opt.decoding.verify.arbitration import ThresholdPolicy  # noqa: E402
from tss_opt.decoding.verify.relaxed import Verifier  # noqa: E402
from tss_opt.search.tolerance import MetricTolerance  # noqa: E402
from tss_opt.training.relaxed import dense_reference  # noqa: E402
from tss_opt.training.relaxed_choice import RelaxedChoice, tune_relaxed  # noqa: E402

# The domains' TSS skip sets: the mapping the CPU preset's searches wrote (docs/results); a
# domain it keeps dense (every one but mmlu there) runs dense under "TSS" too.
DEFAULT_MAPPING = REPO / "docs" / "results" / "mapping_cpu_preset.yaml"


def mapped_skip(mapping_path: str, domain: str) -> tuple[int, ...]:
    """The domain's skip set in ``mapping_path`` (empty when unmapped or dense)."""
    from tss_opt.mapping import load_mapping

    entry = load_mapping(mapping_path).entry_for(domain)
    return tuple(entry.skip_set) if entry is not None else ()


def parse_layers(text: str) -> list[int]:
    """``"20-27"``, ``"8,20-27"`` or ``""`` as a sorted list of layer indices."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def drafter_overrides(args: argparse.Namespace) -> tuple[list[str], str]:
    """Config overrides selecting the drafter, and a line describing it."""
    if args.drafter == "self":
        layers = parse_layers(args.draft_skip)
        return (
            ["drafter=self", f"drafter.skip=[{','.join(map(str, layers))}]", f"drafter.num_tokens={args.draft_tokens}"],
            f"self (skip {args.draft_skip}: {len(layers)} layers, {args.draft_tokens} tokens/step, greedy)",
        )
    if not args.checkpoint:
        raise SystemExit("--drafter eagle needs --checkpoint DIR (an EAGLE-1 head directory) or --checkpoint random")
    head = ["drafter.random_init=true"] if args.checkpoint == "random" else [f"drafter.path={args.checkpoint}"]
    tree = [f"drafter.total_tokens={args.eagle_total_tokens}", f"drafter.depth={args.eagle_depth}",
            f"drafter.top_k={args.eagle_top_k}"]
    return (
        ["drafter=eagle", *head, *tree],
        f"eagle (head {args.checkpoint}; tree total_tokens={args.eagle_total_tokens}, depth={args.eagle_depth}, "
        f"top_k={args.eagle_top_k})",
    )


def _prompts(cfg, rt, split: str, count: int, tokens: int):  # noqa: ANN001
    """``count`` prompts of ``split`` decoded for ``tokens`` tokens under the configured protocol."""
    ps = prompt_set(cfg, rt, split=split, count=count)
    return ps.replace(protocol=ps.protocol.replace(max_new_tokens=tokens))


def _best_fixed(choice: RelaxedChoice) -> float:
    """The searched DIVERSED weight: the feasible fixed weight with the highest accepted length, 1.0 if none."""
    fixed = [c for c in choice.candidates if c.name.startswith("fixed") and c.judged.feasible]
    return max(fixed, key=lambda c: c.judged.accept_length).settings["weight"] if fixed else 1.0


def _tuning_lines(choice: RelaxedChoice, metric: str) -> list[str]:
    lines = [choice.table(metric)]
    for name, rows in choice.history.items():
        for h in rows:
            extra = f"mean w {h['mean_weight']:.2f}" if "mean_weight" in h else f"keep-rate {h['keep_rate']:.2f}"
            lines.append(
                f"  {name} REINFORCE epoch {int(h['epoch'])}: reward {h['reward']:.4f} {metric} {h['metric']:.4f} "
                f"A {h['accept_length']:.3f} {extra}"
            )
    for name, obj in choice.learned.items():
        lines.append(f"  {name} theta = {[round(x, 3) for x in obj.theta.tolist()]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", default="summarization,qa")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--calib-prompts", type=int, default=4)
    ap.add_argument("--calib-tokens", type=int, default=32)
    ap.add_argument("--weights", default="1.0,0.6,0.3", help="DIVERSED's grid of fixed weights")
    ap.add_argument("--epochs", type=int, default=2, help="REINFORCE passes (learned weight and CoSpec policy)")
    ap.add_argument("--eps", type=float, default=0.05, help="metric tolerance (relative) of the paired rule")
    ap.add_argument("--confidence", type=float, default=0.8, help="one-sided confidence of the paired rule")
    ap.add_argument("--tss-skip", default=None, help="one TSS skip set for every domain (e.g. 22 or 6,21,25)")
    ap.add_argument("--mapping", default=str(DEFAULT_MAPPING), help="without --tss-skip: each domain's skip set from this mapping")
    ap.add_argument("--drafter", choices=("self", "eagle"), default="self")
    ap.add_argument(
        "--draft-skip", default="12-15",
        help="self-drafter skip set: ranges and indices (12-15: exact A about 1.8 on summarization; 20-27 never matched)",
    )
    ap.add_argument("--draft-tokens", type=int, default=4, help="self-drafter tokens per step")
    ap.add_argument("--checkpoint", default=None, help="EAGLE head directory (--drafter eagle); 'random' for a random head")
    ap.add_argument("--eagle-total-tokens", type=int, default=16)
    ap.add_argument("--eagle-depth", type=int, default=4)
    ap.add_argument("--eagle-top-k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tss_opt.training.relaxed").setLevel(logging.INFO)
    logging.getLogger("tss_opt.training.relaxed_choice").setLevel(logging.INFO)
    overrides, drafter_line = drafter_overrides(args)
    weights = [float(w) for w in args.weights.split(",")]
    lines = [
        "# Relaxed verification benchmark",
        f"command: OMP_NUM_THREADS={args.threads} python benchmarks/relaxed.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        f"model: embedded SmolLM2-135M-Instruct, float32, {args.threads} thread(s); drafter: {drafter_line}, "
        "return_probs; temperature 0; scope verify",
        f"held-out: {args.prompts} prompts x {args.max_new_tokens} tokens; calibration (tuning): {args.calib_prompts} "
        f"prompts x {args.calib_tokens} tokens; paired rule eps={args.eps} (relative), confidence {args.confidence}",
        "LOSSY rows: their metric change vs exact dense is shown beside their speedup.",
        "",
    ]
    print("\n".join(lines), flush=True)
    t_all = time.perf_counter()
    rt = None
    for domain in args.domains.split(","):
        t_dom = time.perf_counter()
        cfg = compose_config(
            [f"+domain={domain}", *overrides, f"threads={args.threads}", f"model.cache_dir={REPO / 'storage' / 'models'}"]
        )
        rt = rt or assemble(cfg)
        skip = frozenset(parse_layers(args.tss_skip) if args.tss_skip is not None else mapped_skip(args.mapping, domain))
        cal = build_evaluator(cfg, "engine", runtime=rt, prompts=_prompts(cfg, rt, "calibration", args.calib_prompts,
                                                                          args.calib_tokens))
        cal.show_progress = False
        settings = RelaxedSettings(weights=weights, epochs=args.epochs)
        rule = dict(tolerance=MetricTolerance(args.eps), confidence=args.confidence)
        ref = dense_reference(cal)
        div = tune_relaxed(cal, "diversed", skip, settings, reference=ref, **rule)
        cos = tune_relaxed(cal, "cospec", skip, settings, reference=ref, **rule)
        tune_s = time.perf_counter() - t_dom
        out = [f"## {domain} (metric {cal.metric_name}; TSS skip set {sorted(skip)})",
               f"calibration dense exact: A={ref.accept_length:.3f} {cal.metric_name}={ref.metric:.4f} "
               f"({'the draft matched sometimes' if ref.accept_length > 1.0 else 'the draft NEVER matched: uninformative'})",
               "", "DIVERSED tuning (calibration, under the TSS skip set):", *_tuning_lines(div, cal.metric_name),
               "", "CoSpec tuning (calibration, under the TSS skip set):", *_tuning_lines(cos, cal.metric_name),
               f"tune_verification would choose: DIVERSED {div.chosen.name}, CoSpec {cos.chosen.name} "
               f"(tuning {tune_s:.0f}s)"]
        w = _best_fixed(div)
        feasible = {c.name: c.judged.feasible for ch in (div, cos) for c in ch.candidates}
        held = build_evaluator(cfg, "engine", runtime=rt, prompts=_prompts(cfg, rt, "heldout", args.prompts,
                                                                           args.max_new_tokens))
        held.show_progress = False
        methods = [
            ("exact", None, Verifier("exact")),
            (f"DIVERSED searched w={w:.2f}", "exact" if w >= 1.0 else f"fixed w={w:.2f}", Verifier("diversed", weight=w)),
            ("DIVERSED learned w", "learned weight", Verifier("diversed", weight_policy=div.learned["learned weight"])),
            ("CoSpec threshold", "threshold", Verifier("cospec", policy=ThresholdPolicy())),
            ("CoSpec learned", "learned policy", Verifier("cospec", policy=cos.learned["learned policy"])),
        ]
        rows = []
        base = None
        for skip_label, s in (("dense", frozenset()), ("TSS", skip)):
            for name, cand, verifier in methods:
                held.verifier = verifier
                r = held.evaluate(s)
                base = base or r
                rows.append((name, cand, skip_label, r))
        assert base is not None
        out += [
            "",
            f"| method | target | accepted length | {held.metric_name} | Δ metric vs exact dense | tok/s | speedup | "
            "calibration: keeps the metric | lossy |",
            "|---|---|---:|---:|---:|---:|---:|:-:|---|",
        ]
        for name, cand, skip_label, r in rows:
            ok_cell = "—" if cand is None else ("yes" if feasible[cand] else "no")
            out.append(
                f"| {name} | {skip_label} | {r.accept_length:.3f} | {r.metric:.4f} | {r.metric - base.metric:+.4f} | "
                f"{r.tokens_per_s:.2f} | {r.tokens_per_s / base.tokens_per_s:.2f}x | {ok_cell} | "
                f"{'LOSSY ' + r.verification if r.lossy else 'exact'} |"
            )
        out += ["", f"({domain}: {time.perf_counter() - t_dom:.0f}s)", ""]
        print("\n".join(out), flush=True)
        lines += out
    lines.append(f"total wall time {time.perf_counter() - t_all:.0f}s")
    print(lines[-1])
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
