"""Our rows kernels against the products they replace, side by side in one process.

    python benchmarks/rows_kernel.py                       # products, steps, 4 prompts per length
    python benchmarks/rows_kernel.py --parts products      # the products alone (a minute)
    python benchmarks/rows_kernel.py --parts steps,decode --prompts 2 --max-new-tokens 32
    python benchmarks/rows_kernel.py --dtype float32       # the float32 kernel against F.linear

On the embedded model, one thread: in bfloat16 our bfloat16 rows kernel
(``tss_opt/decoding/kernels/rows.py``) against oneDNN's prepacked products; in float32
(``--dtype float32``) our float32 rows kernel (``kernels/rows_f32.py``) against ``F.linear``
(MKL). Below, "the other" is oneDNN or ``F.linear``. Our kernel also runs as it read the weights
before 2026-12-07 (``TSS_ROWS_STREAM=0``, the ``earlier`` schedule of ``rows.SCHEDULE``: no single
stream for few rows, no prefetch; the same bits), as its own arm beside the schedule shipped for
this CPU; the products also run the schedule shipped for the other vendor (``blocks`` on AMD,
``prefetch`` elsewhere). Three parts:

1. ``products``: every linear layer of the model (SmolLM2: 210 decoder products and the output
   head) on 1, 2, 4, 8, 11 and 16 rows through our kernel (every schedule), oneDNN's prepacked
   product (bfloat16) and ``F.linear``, rounds interleaved, beside a plain sum of the same
   weights (the bandwidth limit, timed in the same rounds). Columns: median ms, GB/s of weights streamed, ratios.
2. ``steps``: verification steps of 1, 2, 4, 8, 11 and 16 slots (a chain of 0-15 drafted
   tokens) after ``--lengths`` cached tokens, eager and compiled, on a copy of the model per
   kernel (the earlier schedule runs the shipped copy); the targets take turns in a new order
   every round, median of ``--steps``.
3. ``decode``: plain greedy decoding and prompt lookup (``num_tokens: auto``, sized per request
   from each target's own latency table), eager and compiled, per kernel, on summarization
   calibration prompts at each length, the arms in a new order per prompt. Columns:
   decode tokens/s (median over prompts), the rows/other ratio (median of per-prompt ratios),
   accepted tokens per step, and the lossless verdict of every arm against the same kernel's
   plain eager decoding (``decoding/lossless.py``: identical, or a near-tie; a divergence
   prints FAIL and exits 1).

Without the kernel here (bfloat16: no AVX-512 BF16; float32: no AVX2 and FMA; no C compiler)
it says why and exits 0.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402
from packed_linear import _at_length  # noqa: E402  (benchmarks/, the script's folder)

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.config import config_dir  # noqa: E402
from tss_opt.decoding import linear  # noqa: E402
from tss_opt.decoding.cache import crop_to  # noqa: E402
from tss_opt.decoding.compiled import CompiledTarget  # noqa: E402
from tss_opt.decoding.drafters import build_drafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.kernels import rows, rows_f32  # noqa: E402
from tss_opt.decoding.lossless import check_lossless  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.decoding.tree import DraftTree  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402

ROW_COUNTS = (1, 2, 4, 8, 11, 16)
"""11: prompt lookup's fixed chain of 10 and its root."""
EARLIER = "earlier schedule"
"""The suffix of the arms that run our kernel in the ``earlier`` schedule (``TSS_ROWS_STREAM=0``);
an arm labelled ``..., <name> schedule`` runs ``rows.SCHEDULES[name]``."""
OTHER = {"bfloat16": "oneDNN", "float32": "F.linear"}
"""What our kernel is measured against, per precision."""


@contextmanager
def schedule(label: str) -> Iterator[None]:
    """``rows.SCHEDULE`` inside: the one an arm labelled ``..., <name> schedule`` names, the
    shipped one otherwise (read by our kernels at every call, compiled graphs included)."""
    saved = rows.SCHEDULE
    last = label.rsplit(", ", 1)[-1]
    if last.endswith(" schedule") and last.removesuffix(" schedule") in rows.SCHEDULES:
        rows.SCHEDULE = last.removesuffix(" schedule")
    try:
        yield
    finally:
        rows.SCHEDULE = saved


def _time_into(fn: Callable[[], Any], out: list[float]) -> None:
    """Run ``fn`` once and append its seconds to ``out``."""
    t0 = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t0)


@torch.inference_mode()
def products(model: Any, rounds: int, dtype: str) -> list[str]:
    """Part 1: every linear weight of ``model`` through the products, per row count."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if dtype == "float32":
        weights = [w for w in weights if rows_f32.fits(w)]
        ours: list[torch.Tensor] = weights  # read in place
        mine: Callable[..., torch.Tensor] = rows_f32.rows_linear_f32
        onednn: list[torch.Tensor] = []
    else:
        weights = [w for w in weights if rows.fits(w)]
        ours = [rows.pack(w) for w in weights]
        mine = rows.rows_linear
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    n_bytes = sum(w.numel() * w.element_size() for w in weights)
    alternatives = [f"rows, {s} schedule" for s in rows.SCHEDULES if s != rows.SCHEDULE]
    names = ["sum", "rows", *alternatives, *(["onednn"] if onednn else []), "f.linear"]
    heads = {"sum": "sum of the weights", "rows": f"rows kernel ({rows.SCHEDULE})", "onednn": "oneDNN prepacked",
             "f.linear": "F.linear", **{a: f"rows kernel, {a.removeprefix('rows, ')}" for a in alternatives}}
    lines = [f"{len(weights)} linear weights, {n_bytes / 1e6:.0f} MB, {dtype}; median of {rounds} interleaved rounds", "",
             "| rows | " + " | ".join(f"{heads[a]} ms" for a in names) + " | rows GB/s | "
             + " | ".join(f"{heads[a]} / rows" for a in names[2:]) + " | rows / sum |",
             "|---:|" + "---:|" * (len(names) + 1 + len(names) - 2 + 1)]
    g = torch.Generator().manual_seed(0)
    for m in ROW_COUNTS:
        xs = {k: torch.randn(m, k, generator=g).to(getattr(torch, dtype)) for k in {w.shape[1] for w in weights}}
        arms: dict[str, Callable[[], Any]] = {
            "sum": lambda: [w.sum() for w in weights],
            "rows": lambda xs=xs: [mine(xs[w.shape[1]], p) for w, p in zip(weights, ours)],
            **{a: lambda xs=xs, a=a: _scheduled(a, lambda: [mine(xs[w.shape[1]], p) for w, p in zip(weights, ours)])
               for a in alternatives},
            "onednn": lambda xs=xs: [torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
                               for w, p in zip(weights, onednn)],
            "f.linear": lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights],
        }
        arms = {a: arms[a] for a in names}
        times: dict[str, list[float]] = {a: [] for a in arms}
        for r in range(rounds + 1):
            for a in names[r % len(names):] + names[: r % len(names)]:
                _time_into(arms[a], times[a] if r else [])  # round 0 warms up
        med = {a: statistics.median(times[a]) for a in names}
        lines.append(f"| {m} | " + " | ".join(f"{med[a] * 1e3:.2f}" for a in names)
                     + f" | {n_bytes / med['rows'] / 1e9:.1f} | "
                     + " | ".join(f"{med[a] / med['rows']:.2f}x" for a in names[2:]) + f" | {med['rows'] / med['sum']:.2f}x |")
    return lines


def _scheduled(label: str, fn: Callable[[], Any]) -> Any:
    with schedule(label):
        return fn()


def _chain(n: int) -> DraftTree:
    return DraftTree(tokens=torch.arange(3, 3 + n), parents=tuple(range(-1, n - 1))) if n else DraftTree.empty()


def prefilled(targets: dict[str, TargetModel], length: int, vocab: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """A random prompt of ``length`` tokens (seeded by the length: every target and run sees
    the same one) prefilled into a new cache of each target; returns the prompt and the caches."""
    prompt = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(length))
    caches = {}
    for name, t in targets.items():
        caches[name] = t.new_cache()
        t.prefill(prompt, caches[name])
    return prompt, caches


@torch.inference_mode()
def steps(targets: dict[str, TargetModel], lengths: list[int], n_steps: int, vocab: int, kinds: list[str]) -> list[str]:
    """Part 2: verification steps of each slot count, per target (``"<kind>, eager"`` and
    ``"<kind>, compiled"`` for each of ``kinds``, the shipped one first), alternating."""
    mine, others = kinds[0], kinds[1:]
    lines = ["| cached | slots | " + " | ".join(f"{n} ms" for n in targets) + " | "
             + " | ".join(f"{o} / {mine}, {mode}" for o in others for mode in ("eager", "compiled")) + " |",
             "|---:|---:|" + "---:|" * (len(targets) + 2 * len(others))]
    for length in lengths:
        prompt, caches = prefilled(targets, length, vocab)
        for slots in ROW_COUNTS:
            tree = _chain(slots - 1)
            times: dict[str, list[float]] = {n: [] for n in targets}
            for i in range(n_steps + 2):  # two warm-up steps
                # A new order every round: a rotation kept each target behind the same one, and
                # two targets running the same graph (a plain compiled step) then differed by 7-12 %.
                names = list(targets)
                random.Random(i).shuffle(names)
                for name in names:
                    with schedule(name.rsplit(", ", 1)[0]):
                        t0 = time.perf_counter()
                        targets[name].verify_forward(int(prompt[i % length]), tree, caches[name], length)
                        if i >= 2:
                            times[name].append(time.perf_counter() - t0)
                    crop_to(caches[name], length)
            med = {n: statistics.median(v) for n, v in times.items()}
            lines.append(f"| {length} | {slots} | " + " | ".join(f"{v * 1e3:.1f}" for v in med.values()) + " | "
                         + " | ".join(f"{med[f'{o}, {mode}'] / med[f'{mine}, {mode}']:.2f}x"
                                      for o in others for mode in ("eager", "compiled")) + " |")
    return lines


def _assemble_with(settings: list[str], kernel: Any, env: dict[str, str]) -> Any:
    """The runtime of ``settings`` with ``kernel`` made unavailable (``kernel=None``: as
    shipped) and ``env`` set while its target is built and compiled (building packs it)."""
    real = kernel.available if kernel is not None else None
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if kernel is not None:
        kernel.available = lambda: False
    try:
        rt = assemble(compose_config(settings))
        rt.compiled = CompiledTarget(rt.loaded.model)
    finally:
        if kernel is not None:
            kernel.available = real
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="products,steps,decode")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the products part")
    ap.add_argument("--steps", type=int, default=20, help="steps per slot count of the steps part")
    ap.add_argument("--lengths", default="64,0", help="prompt lengths in tokens; 0: the domain's own (steps: 800)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(OTHER), help="which of our kernels")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the kernel's condition (decoding/linear.py)
    parts = set(args.parts.split(","))
    kernel = rows_f32 if args.dtype == "float32" else rows
    other = OTHER[args.dtype]
    if kernel.unavailable_reason() is not None or not kernel.available():
        print(f"the {args.dtype} rows kernel cannot run here ({kernel.unavailable_reason() or 'its build failed'}): "
              "nothing to compare")
        return
    settings = [f"dtype={args.dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]
    # As shipped (on a CPU with AMX: our kernel up to 8 rows, oneDNN's AMX product from 9); on
    # such a CPU the rows kernel alone too (TSS_AMX_ROWS=0); then the other (oneDNN's packing,
    # bfloat16, or F.linear, float32), each with its compiled target.
    runtimes = {"shipped": _assemble_with(settings, None, {})}
    if linear.packed_kernel(runtimes["shipped"].loaded.model) == "rows+amx":
        runtimes["rows only"] = _assemble_with(settings, None, {"TSS_AMX_ROWS": "0"})
    runtimes["other"] = _assemble_with(settings, kernel, {})
    kinds = {name: linear.packed_kernel(rt.loaded.model) for name, rt in runtimes.items()}
    assert kinds["shipped"] in ("rows", "rows+amx") and kinds.get("rows only", "rows") == "rows", kinds
    assert kinds["other"] == ("onednn" if args.dtype == "bfloat16" else None), kinds
    names = {"shipped": kinds["shipped"], "rows only": "rows", "other": other}
    labelled = {names[k]: rt for k, rt in runtimes.items()}
    # The shipped target again, its kernel reading the weights as before 2026-12-07 (the same
    # packed weights and graphs: rows.SCHEDULE is read at every call), just before the other.
    # Where oneDNN has AMX it keeps the shipped target's split (oneDNN's product from 9 rows,
    # fixed when packed), where TSS_ROWS_STREAM=0 at start packs for 7: only the kernel's own
    # schedule differs between the two arms.
    labelled = {**{k: v for k, v in labelled.items() if k != other}, f"{kinds['shipped']}, {EARLIER}": runtimes["shipped"],
                other: runtimes["other"]}
    print(f"# rows_kernel: SmolLM2-135M {args.dtype}, our kernel ({' and '.join(list(labelled)[:-1])}; shipped schedule "
          f"here: {rows.SCHEDULE}) against {other}, 1 thread, torch {torch.__version__}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    lengths = [int(x) for x in args.lengths.split(",")]
    if "products" in parts:
        print("\n## 1. The products\n")
        print("\n".join(products(runtimes["shipped"].loaded.model, args.rounds, args.dtype)), flush=True)
    if "steps" in parts:
        print(f"\n## 2. Verification steps (median of {args.steps}, the {2 * len(labelled)} targets alternating)\n")
        targets = {f"{k}, {mode}": (rt.target if mode == "eager" else rt.compiled)
                   for k, rt in labelled.items() for mode in ("eager", "compiled")}
        vocab = int(runtimes["shipped"].loaded.model.config.vocab_size)
        print("\n".join(steps(targets, [n or 800 for n in lengths], args.steps, vocab, list(labelled))), flush=True)
    if "decode" in parts:
        decode(labelled, lengths, args.prompts, args.max_new_tokens)


def decode(runtimes: dict[str, Any], lengths: list[int], n_prompts: int, n: int) -> None:
    """Part 3: whole requests per kernel (``runtimes``, the shipped one first), eager and
    compiled, plain and prompt lookup."""
    first = next(iter(runtimes.values()))
    tok = first.loaded.tokenizer
    eos = list(first.eos_token_ids)
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / "summarization.yaml"))
    cal = [format_prompt(tok, ex, dom.config.system_prompt) for ex in dom.split("calibration")]
    pld_cfg = OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / "pld.yaml"), {"num_tokens": "auto"})
    kinds = list(runtimes)
    mine, others = kinds[0], kinds[1:]
    arms: dict[tuple[str, str], tuple[TargetModel, Any]] = {}
    for k, rt in runtimes.items():
        with schedule(k):  # sized from the latency tables of the schedule the arm runs
            arms[(k, "plain")] = (rt.target, None)
            arms[(k, "prompt lookup, auto")] = (rt.target, build_drafter(pld_cfg, rt.target, rt.loaded))
            arms[(k, "plain, compiled")] = (rt.compiled, None)
            arms[(k, "prompt lookup, auto, compiled")] = (rt.compiled, build_drafter(pld_cfg, rt.compiled, rt.loaded))
    failures: list[str] = []
    for length in lengths:
        prompts = [_at_length(cal[i % len(cal)], length, cal[-1]) for i in range(n_prompts)]
        for target, _ in arms.values():  # compile every bucket before anything is timed
            if target.compiled:
                SpeculativeEngine(target, None, eos_token_ids=eos).generate(prompts[0], max_new_tokens=4)
        rate: dict[tuple[str, str], list[float]] = {a: [] for a in arms}
        accepted: dict[tuple[str, str], list[float]] = {a: [] for a in arms}
        verdicts: dict[tuple[str, str], list[str]] = {a: [] for a in arms}
        for i, ids in enumerate(prompts):
            order = list(arms)
            random.Random(i).shuffle(order)  # not a rotation: each arm behind another one every prompt
            out: dict[tuple[str, str], list[int]] = {}
            for a in order:
                target, drafter = arms[a]
                with schedule(a[0]):
                    res = SpeculativeEngine(target, drafter, eos_token_ids=eos).generate(ids, max_new_tokens=n)
                out[a] = res.tokens.tolist()
                rate[a].append((len(res.tokens) - 1) / (res.stats.total_s - res.stats.prefill_s))
                accepted[a].append(res.stats.accept_length)
            for a in arms:
                plain = out[(a[0], "plain")]
                v = check_lossless(runtimes[a[0]].target, ids, plain, out[a]).verdict
                verdicts[a].append(v)
                if v == "diverged":
                    failures.append(f"{a[0]} {a[1]}, length {length}, prompt {i}: {v} against plain decoding")
        print(f"\n## 3. Decoding: prompts of {length or 'the domain’s own length'} tokens, {n_prompts} prompts x {n} "
              f"new tokens\n")
        print("| method | " + " | ".join(f"{k} tok/s" for k in kinds) + " | "
              + " | ".join(f"{mine} / {o}" for o in others) + f" | accepted ({', '.join(kinds)}) | "
              + " | ".join(f"{k} vs plain" for k in kinds) + " |")
        print("|---|" + "---:|" * (2 * len(kinds) - 1) + "---|" * (1 + len(kinds)))

        def tally(vs: list[str]) -> str:
            return ", ".join(f"{vs.count(v)} {v}" for v in dict.fromkeys(vs))

        for m in dict.fromkeys(a[1] for a in arms):
            ratios = [statistics.median(x / y for x, y in zip(rate[(mine, m)], rate[(o, m)])) for o in others]
            acc = ", ".join(f"{statistics.median(accepted[(k, m)]):.2f}" for k in kinds)
            print(f"| {m} | " + " | ".join(f"{statistics.median(rate[(k, m)]):.2f}" for k in kinds) + " | "
                  + " | ".join(f"{r:.2f}x" for r in ratios) + f" | {acc} | "
                  + " | ".join(tally(verdicts[(k, m)]) for k in kinds) + " |", flush=True)
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
