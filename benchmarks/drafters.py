"""Drafters built from the target against the training-free ones, on held-out prompts.

    python benchmarks/drafters.py --domains summarization,translation \\
        --method pld --method samd --method eagle:random \\
        --method "eagle:storage/drafters/smollm2_135m/summarization/eagle" ... \\
        --method "t2d:storage/drafters/smollm2_135m/summarization/t2d" --method "self:storage/drafters/smollm2_135m/summarization/t2d"

A method is ``NAME`` (a shipped drafter config: pld, samd, token_recycle), ``eagle:random`` (a
random head of the target's shapes), ``eagle:DIR`` (a trained head), ``eagle@DOMAIN:DIR`` (a
head used on DOMAIN only, e.g. each domain's own head), ``t2d:DIR`` (a T2D drafter) or
``eagle:DIR#k=v,...`` (a trained head with drafter settings, e.g.
``#draft_vocab=0,total_tokens=10,depth=4,top_k=3``), ``self:DIR`` (the self-drafter that keeps the same target layers as the T2D drafter in DIR,
without distillation: what distillation adds). For every domain (held-out prompts) and method,
dense and combined with the TSS skip set ``--skip`` (scope verify): accepted length
(committed tokens per verification), the domain's metric, tokens/s (new tokens over decoding
time; the dense prefill is computed once per prompt and shared) and whether every output
equals plain greedy decoding of the same target (all are lossless: they must). Methods run in
a rotated order per prompt so machine drift hits them alike. The training wall time of each
trained drafter is read from its folder's report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _measure as bench  # noqa: E402

# EAGLE heads: training.json (its "seconds": the training loop); T2D: t2d_report.json ("total_s":
# search + distillation).
REPORT_FILES = ("training.json", "t2d_report.json")


@dataclass
class TrainedMethod(bench.Method):
    """A method with its drafter's training wall time, optionally restricted to one domain."""

    train_s: float | None = None
    domain: str | None = None  # only on this domain (a domain's own head)


def shipped(name: str, **over: Any) -> dict[str, Any]:
    """A shipped drafter config without its ``train`` block (the benchmark only decodes)."""
    out = bench.shipped_drafter(name, **over)
    out.pop("train", None)
    return out


def training_seconds(folder: Path) -> float | None:
    """The training wall time its trainer recorded, if any (data preparation not included)."""
    for name in REPORT_FILES:
        p = folder / name
        if p.is_file():
            data = json.loads(p.read_text())
            for key in ("total_s", "seconds"):
                if isinstance(data.get(key), (int, float)):
                    return float(data[key])
    return None


def parse_overrides(text: str) -> dict[str, Any]:
    """``"draft_vocab=0,total_tokens=8"`` -> ``{"draft_vocab": 0, "total_tokens": 8}`` (YAML values)."""
    import yaml

    out: dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"drafter setting {item!r}: expected KEY=VALUE, e.g. draft_vocab=0")
        out[key.strip()] = yaml.safe_load(value)
    return out


def parse_method(spec: str, num_layers: int) -> tuple[str, dict[str, Any], float | None, str | None]:
    """``spec`` -> (label, drafter config, training seconds, domain restriction)."""
    kind, _, arg = spec.partition(":")
    kind, _, only = kind.partition("@")
    arg, _, opts = arg.partition("#")
    over = parse_overrides(opts)
    only_domain = only or None
    if not arg:
        return kind, shipped(kind), None, only_domain
    if kind == "eagle" and arg == "random":
        return "eagle (random head)", shipped("eagle", random_init=True, path=None), 0.0, only_domain
    folder = Path(arg)
    if not folder.is_dir():
        raise SystemExit(f"--method {spec!r}: {folder} is not a directory; train it first (docs/drafters.md)")
    if kind == "eagle":
        name = folder.name if folder.name != "eagle" else folder.parent.name
        label = f"eagle ({name}" + "".join(f", {k}={v}" for k, v in over.items()) + ")"
        return label, shipped("eagle", path=str(folder), **over), training_seconds(folder), only_domain
    report = json.loads((folder / "t2d_report.json").read_text()) if (folder / "t2d_report.json").is_file() else None
    if kind == "t2d":
        return f"t2d ({len(report['keep_layers']) if report else '?'} layers)", shipped("t2d", path=str(folder)), training_seconds(folder), only_domain
    if kind == "self":
        if report is None:
            raise SystemExit(f"--method {spec!r}: {folder}/t2d_report.json is missing (self:DIR takes a T2D folder)")
        keep = set(report["keep_layers"])
        skip = [i for i in range(num_layers) if i not in keep]
        return f"self ({len(keep)} layers, no distillation)", shipped("self", skip=skip), 0.0, only_domain
    raise SystemExit(f"--method {spec!r}: unknown kind {kind!r}; expected a drafter name, eagle:, t2d: or self:")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default="summarization,translation")
    ap.add_argument("--split", default="heldout", choices=["calibration", "validation", "heldout"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--method", action="append", default=None, help="repeatable; see the module docstring")
    ap.add_argument("--skip", default="", help="a TSS skip set combined with every method (empty: dense only)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    skip = tuple(int(s) for s in args.skip.split(",") if s.strip())
    rt = bench.load_runtime(args.dtype)
    num_layers = int(rt.loaded.config.num_layers)
    specs = [parse_method(s, num_layers) for s in (args.method or ["pld", "samd", "eagle:random"])]
    skips = [()] + ([skip] if skip else [])
    print(
        f"{bench.machine_line('Drafter', args.dtype, args.prompts, args.split, args.max_new_tokens)}; "
        f"target skip sets {[list(s) for s in skips]} (scope verify)",
        flush=True,
    )
    for dom_name in args.domains.split(","):
        domain = bench.load_named_domain(dom_name)
        examples = domain.split(args.split)[: args.prompts]
        methods = [TrainedMethod("plain decoding", None, s) for s in skips]
        methods += [
            TrainedMethod(label, cfg, s, train_s=t, domain=only)
            for s in skips
            for label, cfg, t, only in specs
            if only is None or only == dom_name
        ]
        seconds = bench.measure_domain(rt, methods, domain, dom_name, examples, args.max_new_tokens)
        refs = [list(ex.references) for ex in examples]
        metric = domain.metric
        print(bench.domain_heading(dom_name, examples, args.split, args.max_new_tokens, metric.name, seconds))
        print(f"| method | target | training | accepted length | {metric.name} | tok/s median | vs plain | identical to plain |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        for m in methods:
            plain = bench.plain_reference(methods, m)
            score = metric.score(m.texts, refs).value
            ratio = statistics.median(a / b for a, b in zip(m.tps, plain.tps, strict=True))
            train = "—" if m.train_s is None else ("0" if m.train_s == 0 else f"{m.train_s / 60:.1f} min")
            print(
                f"| {m.label} | {m.target_label} | {train} | {m.accept_length:.2f} | {score:.4f} | "
                f"{statistics.median(m.tps):.2f} | {ratio:.2f}x | {sum(m.same)}/{len(m.same)} |"
            )
        print(flush=True)


if __name__ == "__main__":
    main()
