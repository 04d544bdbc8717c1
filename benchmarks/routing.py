"""Routing accuracy of the domain router on the held-out prompts of the shipped domains.

    python benchmarks/routing.py [--limit 64] [--max-tokens 256] [--margin 0.8] [--out storage/report]

Fits :class:`tss_opt.runtime.DomainRouter` on the calibration prompts (16 per domain) of the
five shipped domains with the embedded SmolLM2-135M, routes the held-out prompts (64 per
domain, disjoint from the calibration ones) and prints the confusion matrix; a few prompts
unlike every domain check that they fall back to dense. Writes ``routing.md`` and
``routing.json`` into ``--out``. Takes a few minutes on 2 CPU cores (one dense forward of at
most ``--max-tokens`` tokens per prompt).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from tss_opt.assembly import assemble, compose_config
from tss_opt.config import config_dir
from tss_opt.evaluation.domains import (
    Example,
    available_domains,
    format_prompt,
    load_domain,
    read_domain_config,
)
from tss_opt.runtime.router import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_THRESHOLD_MARGIN,
    DomainRouter,
)
from tss_opt.runtime.routing_eval import routing_accuracy

# Requests none of the shipped domains covers: they should run dense.
FAR_AWAY = [
    "Write a haiku about autumn leaves falling in the rain.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n# make this faster",
    "Tell me a joke about a cat and a vacuum cleaner.",
    "Compose a short birthday message for my grandmother who turns 90.",
    "Hi! How are you doing today?",
    "List five fun things to do in a small town on a rainy weekend.",
    "Write a limerick about a programmer who never sleeps.",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 3; explain this query",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=None, help="held-out prompts per domain (default: all 64)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="prompt tokens embedded")
    p.add_argument("--margin", type=float, default=DEFAULT_THRESHOLD_MARGIN, help="threshold calibration margin")
    p.add_argument("--model-cache", default="storage/models", help="model.cache_dir of the embedded model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="storage/report", help="folder for routing.md / routing.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)

    rt = assemble(compose_config([f"model.cache_dir={args.model_cache}"]))
    loaded, target = rt.loaded, rt.target
    domains = [load_domain(read_domain_config(n, [config_dir()])) for n in available_domains([config_dir()])]
    t0 = time.perf_counter()
    router = DomainRouter.fit_domains(
        target, loaded.tokenizer, domains, max_tokens=args.max_tokens, margin=args.margin, model_id=loaded.model_id
    )
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = routing_accuracy(router, loaded.tokenizer, domains, limit=args.limit)
    route_s = (time.perf_counter() - t0) / rep.total
    far = []
    for text in FAR_AWAY:
        d = router.route(format_prompt(loaded.tokenizer, Example(id="far", prompt=text, references=())))
        far.append({"prompt": text, "routed": d.domain, "nearest": d.nearest, "similarity": round(d.similarity, 4)})
    fell_back = sum(f["routed"] is None for f in far)

    lines = [
        f"# Domain routing ({loaded.model_id}, first {args.max_tokens} prompt tokens)",
        "",
        f"Fitted on {sum(len(d.split('calibration')) for d in domains)} calibration prompts in {fit_s:.0f} s; "
        f"{1000 * route_s:.0f} ms per routed prompt.",
        "",
        rep.to_markdown(),
        "",
        f"Far-away prompts falling back to dense: {fell_back}/{len(far)}",
        "",
        "| prompt | routed | nearest | similarity |",
        "|---|---|---|---:|",
        *[f"| {f['prompt'][:50]!r} | {f['routed'] or 'dense'} | {f['nearest']} | {f['similarity']:.3f} |" for f in far],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "routing.md").write_text(text, encoding="utf-8")
    data = {
        "model": loaded.model_id, "max_tokens": args.max_tokens, "threshold": router.threshold,
        "accuracy": rep.accuracy, "nearest_accuracy": rep.nearest_accuracy, "fallback_rate": rep.fallback_rate,
        "per_domain": rep.per_domain, "confusion": rep.confusion, "far_away": far, "fit_s": fit_s, "route_s": route_s,
    }
    (out / "routing.json").write_text(json.dumps(data, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
