"""llama.cpp on the dense and the sparse GGUF of the embedded model, beside our engine.

    python benchmarks/gguf_speed.py                        # the run in docs/results/gguf_speed.txt
    python benchmarks/gguf_speed.py --prompts 2 --max-new-tokens 32 --outtypes f32

Exports the embedded SmolLM2-135M twice per ``--outtypes`` entry with ``export_domain_gguf``
(the library of ``export_model format=gguf``): the dense model (empty skip set) and the sparse
target with ``--skip`` deleted (an entry of scope ``all``, written to a temporary mapping).
Then, on held-out prompts of ``--domain``, in one process and interleaved per prompt with a
rotating order (machine drift hits every arm alike): llama.cpp (llama-cpp-python, greedy
sampler) on each file, and our engine's plain greedy decoding (no drafter) of the dense model
and of the skip set in scope ``all``, all on ``--threads`` threads. On the first outtype's files,
speculative decoding on llama.cpp too: llama-cpp-python's prompt lookup drafter
(``LlamaPromptLookupDecoding``, ``--lookup`` tokens; llama.cpp verifies each draft in one batch). Every arm generates exactly
``--max-new-tokens`` tokens (end-of-sequence does not stop it, so each arm does the same work).
Decoding tokens/s is the tokens after the first over the time after the first (the prompt's
processing, which ends with the first token, is timed apart: held-out summarization prompts
are 600-1500 tokens long, and their processing would hide the decoding speed).

Our arms (``--ours``, ``DTYPE:METHOD`` pairs): plain greedy decoding in each named dtype
(dense and the skip set) and our speculative decoding at the shipped sized defaults
(``pld_auto``, ``samd_auto``, ``merged_auto``, ... as benchmarks/decode.py names them; the
dense target; ``@compiled`` runs one on the compiled step, ``compile=true``), sized from this machine's latency tables in that dtype and acceptance
profiles measured on ``--calibrate`` calibration prompts (not decoded here). The half
precision comparison: llama.cpp on the ``bf16`` GGUF (the engine's float32 weights rounded to
bfloat16 exactly as ``dtype=bfloat16`` rounds them) against ours in ``bfloat16``.

Columns: decoding tokens/s median over prompts; its ratio to the same engine's dense arm
(median of the per-prompt ratios: does the layer skipping show as speed?), to our plain
float32 decoding of the same target and to the fastest llama.cpp arm of the same target;
prompt processing seconds (median) and its ratio to the same engine's dense arm; prompts
whose tokens equal our plain float32 decoding's on the same target, and (in brackets) the
new tokens before each prompt's first divergence over all new tokens (f32 should equal; f16,
bf16 and q8_0 round the weights); for our speculative arms, lossless by
tss_opt/decoding/lossless.py against our plain decoding in the same dtype (identical /
near-tie / diverged; a diverged prompt prints FAIL and the script exits 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from decode import DRAFTERS, calibrate  # noqa: E402  (benchmarks/, the script's folder)
from omegaconf import OmegaConf  # noqa: E402

from tss_opt.assembly import assemble, compose_config  # noqa: E402
from tss_opt.config import config_dir  # noqa: E402
from tss_opt.config.enums import GGUFOutType  # noqa: E402
from tss_opt.decoding.drafters import build_drafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.lossless import check_lossless  # noqa: E402
from tss_opt.decoding.sizing import ENV_DIR  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.evaluation.domains import format_prompt, load_domain  # noqa: E402
from tss_opt.mapping import MappingEntry, load_mapping, write_entry  # noqa: E402
from tss_opt.mapping.gguf_export import export_domain_gguf, source_gguf_path  # noqa: E402
from tss_opt.mapping.llama_runner import open_llama  # noqa: E402
from tss_opt.models import ModelConfig, load_model, model_id_for  # noqa: E402


@dataclass
class Arm:
    """One benchmarked way to decode and what it measured.

    Attributes:
        label: The table's row name.
        engine: ``llama.cpp`` or ``ours``.
        target: ``dense`` or the skip set, as the table shows it.
        run: Decodes ``(prompt ids, n)`` into exactly ``n`` tokens; returns them with the
            seconds to the first token (prompt processing) and to the last.
        tps: Per prompt, decoding tokens/s (after the first token).
        prefill: Per prompt, seconds to the first token.
        tokens: Per prompt, the tokens.
        dtype: Our arms: the precision they decode in (``float32``, ``bfloat16``).
        check: Our speculative arms: the target that judges them lossless against the plain
            arm of ``dtype`` (:func:`~tss_opt.decoding.lossless.check_lossless`).
        verdicts: Per prompt, that verdict.
    """

    label: str
    engine: str
    target: str
    run: Callable[[list[int], int], Run]
    dtype: str = ""
    check: TargetModel | None = None
    verdicts: list[str] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)


Run = tuple[list[int], float, float]  # tokens, seconds to the first, seconds to the last


def llama_run(path: str, threads: int, n_ctx: int, lookup: int = 0, quantized: bool = False) -> Callable[[list[int], int], Run]:
    """llama.cpp's greedy decoding of ``path``; ``lookup`` > 0 adds llama-cpp-python's prompt
    lookup drafter (that many tokens; llama.cpp verifies the drafts in one batch); ``quantized``:
    the file's matrices are a quantized type (q8_0)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    # A drafter needs every position's logits; llama-cpp-python sizes its logits buffer from the
    # logits_all argument (not from the drafter), so it is passed explicitly. A quantized file
    # on a CPU with AMX loads without weight repacking, which crashes there (llama_runner.py).
    load = open_llama(
        path, quantized=quantized, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0,
        draft_model=draft, logits_all=draft is not None,
    )
    if not load.repacking:
        print(f"{Path(path).name}: llama.cpp loaded without weight repacking (a quantized file on a CPU with AMX, "
              "where it crashes: tss_opt/mapping/llama_runner.py); its speed is the generic CPU kernels'", flush=True)
    llm = load.llm

    def run(ids: list[int], n: int) -> Run:
        llm.reset()  # no prefix reuse between prompts or arms
        out: list[int] = []
        t0 = time.perf_counter()
        first = 0.0
        for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            first = first or time.perf_counter() - t0
            if len(out) == n:
                break
        return out, first, time.perf_counter() - t0

    return run


def engine_run(target: TargetModel, skip: tuple[int, ...], drafter: Any = None) -> Callable[[list[int], int], Run]:
    """Our engine on ``target`` (no end-of-sequence: exactly n tokens), plain greedy without a
    drafter; one drafter instance per arm for the whole run, as in serving."""
    engine = SpeculativeEngine(target, drafter)

    def run(ids: list[int], n: int) -> Run:
        t0 = time.perf_counter()
        first: list[float] = []

        def on_step(_tokens: torch.Tensor) -> None:  # first called after the prefill's token
            if not first:
                first.append(time.perf_counter() - t0)

        res = engine.generate(torch.tensor(ids), max_new_tokens=n, skip=skip, scope="all", on_step=on_step)
        return res.tokens.tolist(), first[0], time.perf_counter() - t0

    return run


def median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip", default="3,14", help="layers deleted in the sparse GGUF (default: mmlu's mapped set)")
    ap.add_argument("--domain", default="summarization", help="prompts: this domain's held-out split")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--outtypes", default="f32,bf16,q8_0", help="GGUF tensor types, each exported dense and sparse")
    ap.add_argument("--ours", default="float32:plain,bfloat16:plain,bfloat16:pld_auto,bfloat16:samd_auto,bfloat16:merged_auto",
                    help="our arms, DTYPE:METHOD (plain: dense and sparse; a drafter key of benchmarks/decode.py: dense)")
    ap.add_argument("--calibrate", type=int, default=2,
                    help="calibration prompts for the sized drafters' acceptance profiles (0: priors)")
    ap.add_argument("--sizing-dir", type=Path, default=REPO / "storage" / "tree_sizing")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp and torch threads")
    ap.add_argument("--lookup", type=int, default=10,
                    help="draft tokens of the prompt-lookup arms on the first outtype's files (0: none)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    skip = tuple(int(s) for s in args.skip.split(",") if s.strip())
    outtypes = [t.strip() for t in args.outtypes.split(",") if t.strip()]

    t_run = time.perf_counter()
    mc = ModelConfig(cache_dir=str(REPO / "storage" / "models"))
    loaded = load_model(mc)
    tok = loaded.tokenizer
    model_id = model_id_for(mc)
    domain = load_domain(OmegaConf.load(config_dir() / "domain" / f"{args.domain}.yaml"))
    prompts = [format_prompt(tok, ex, domain.config.system_prompt).tolist() for ex in domain.split("heldout")[: args.prompts]]

    n_ctx = max(len(p) for p in prompts) + args.max_new_tokens + args.lookup + 16
    work = Path(tempfile.mkdtemp(prefix="tss_gguf_speed_"))
    base = MappingEntry(
        domain="dense", skip_set=(), accept_length=1.0, metric=0.0, metric_name="none", cost=1.0, sparsity=0.0,
        baseline={"accept_length": 1.0, "metric": 0.0, "cost": 1.0}, model=model_id, num_layers=mc.num_layers,
        drafter=None, study={"name": "benchmark", "storage": "none"}, selection="min_cost", scope="all",
    )
    write_entry(work / "mapping.yaml", base)
    write_entry(work / "mapping.yaml", replace(base, domain="sparse", skip_set=skip, sparsity=len(skip) / mc.num_layers))
    mapping = load_mapping(work / "mapping.yaml")
    source = source_gguf_path(mc)
    sparse_label = str(list(skip))
    arms: list[Arm] = []
    for outtype in outtypes:
        for name, label in (("dense", "dense"), ("sparse", sparse_label)):
            t0 = time.perf_counter()
            summary = export_domain_gguf(
                source, mapping, name, work / outtype, model_name=mc.name, model_id=model_id,
                num_layers=mc.num_layers, outtype=outtype,
            )
            size = Path(summary.out).stat().st_size / 2**20
            print(f"exported {label} {outtype}: {summary.layers} blocks, {size:.0f} MiB in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            quantized = GGUFOutType(outtype).quantized
            arms.append(Arm(f"llama.cpp {outtype} GGUF", "llama.cpp", label,
                            llama_run(summary.out, args.threads, n_ctx, quantized=quantized)))
            if outtype == outtypes[0] and args.lookup:
                arms.append(Arm(
                    f"llama.cpp {outtype} GGUF + prompt lookup ({args.lookup})", "llama.cpp", label,
                    llama_run(summary.out, args.threads, n_ctx, args.lookup, quantized=quantized),
                ))
    arms += ours_arms(args, domain, skip, sparse_label)
    if not any(a.label == "ours: plain decoding (float32)" for a in arms):
        raise SystemExit(f"--ours {args.ours!r} must include float32:plain (the tokens every arm is compared with)")

    for a in arms:  # warm-up: first-call allocations and kernel selection out of the timings
        a.run(prompts[0][:32], 4)
    for i, ids in enumerate(prompts):
        for a in arms[i % len(arms):] + arms[: i % len(arms)]:
            out, first, total = a.run(ids, args.max_new_tokens)
            a.tps.append((len(out) - 1) / (total - first))
            a.prefill.append(first)
            a.tokens.append(out)
        print(f"prompt {i + 1}/{len(prompts)} ({len(ids)} tokens) done", flush=True)
    failures = judge_lossless(arms, prompts)

    ours = {a.target: a for a in arms if a.label == "ours: plain decoding (float32)"}
    dense_of = {(a.label, a.engine): a for a in arms if a.target == "dense"}
    fastest_llama = {t: max((a for a in arms if a.engine == "llama.cpp" and a.target == t), key=lambda a: statistics.median(a.tps),
                            default=None) for t in {a.target for a in arms}}
    print(
        f"\n## {mc.name} ({model_id}), {args.domain} held-out prompts: {len(prompts)} x {args.max_new_tokens} new tokens, "
        f"{args.threads} thread(s); sparse = layers {sparse_label} deleted ({mc.num_layers - len(skip)} of "
        f"{mc.num_layers}), scope all\n"
    )
    print("| engine / file | target | decoding tok/s median | ratio to its dense | ratio to ours float32 plain, same target | "
          "ratio to the fastest llama.cpp arm, same target | prompt s median | prompt time ratio to its dense | "
          "same tokens as ours float32 plain, same target | lossless (identical / near-tie / diverged) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for a in arms:
        dense = dense_of[(a.label, a.engine)]
        mine = ours[a.target]
        fast = fastest_llama[a.target]
        vs_llama = f"{median_ratio(a.tps, fast.tps):.3f} ({fast.label})" if fast is not None else "-"
        verdict = "-" if not a.verdicts else " / ".join(str(a.verdicts.count(v)) for v in ("identical", "near_tie", "diverged"))
        same = sum(x == y for x, y in zip(a.tokens, mine.tokens))
        # New tokens equal to ours before each prompt's first divergence, over all new tokens.
        prefix = sum(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(y)) for x, y in zip(a.tokens, mine.tokens))
        total = sum(len(y) for y in mine.tokens)
        print(
            f"| {a.label} | {a.target} | {statistics.median(a.tps):.1f} | {median_ratio(a.tps, dense.tps):.3f} | "
            f"{median_ratio(a.tps, mine.tps):.3f} | {vs_llama} | {statistics.median(a.prefill):.2f} | "
            f"{median_ratio(a.prefill, dense.prefill):.3f} | {same}/{len(prompts)} ({prefix}/{total} tokens) | {verdict} |"
        )
    summarize(arms)
    print(f"\nprompt lengths {[len(p) for p in prompts]}; wall time {time.perf_counter() - t_run:.0f} s")
    shutil.rmtree(work)  # the GGUF files (hundreds of MiB each)
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        raise SystemExit(1)


def ours_arms(args: argparse.Namespace, domain: Any, skip: tuple[int, ...], sparse_label: str) -> list[Arm]:
    """Our arms per ``--ours``: one model per dtype; the sized drafters read this machine's
    latency tables in that dtype (measured once, cached in ``--sizing-dir``) and acceptance
    profiles measured on calibration prompts (``<sizing-dir>/bench-<domain>/``, shared with
    benchmarks/decode.py)."""
    pairs = [tuple(p.strip().split(":", 1)) for p in args.ours.split(",") if p.strip()]
    bad = [":".join(p) for p in pairs if len(p) != 2 or p[1].removesuffix("@compiled") not in ("plain", *DRAFTERS)]
    if bad:
        raise SystemExit(f"--ours {bad}: expected DTYPE:METHOD[@compiled], METHOD plain or one of {', '.join(DRAFTERS)}")
    ddir = args.sizing_dir / f"bench-{domain.config.name}"
    ddir.mkdir(parents=True, exist_ok=True)
    for f in [*args.sizing_dir.glob("latency-*.json"), *args.sizing_dir.glob("draft-*.json")]:
        shutil.copy(f, ddir / f.name)
    os.environ[ENV_DIR] = str(ddir)
    arms: list[Arm] = []
    for dtype in dict.fromkeys(d for d, _ in pairs):
        rt = assemble(compose_config([f"dtype={dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]))
        tok = rt.loaded.tokenizer
        if args.calibrate and any(m != "plain" for d, m in pairs if d == dtype):
            cal = domain.split("calibration")[: args.calibrate]
            for line in calibrate(rt, ddir, [format_prompt(tok, ex, domain.config.system_prompt) for ex in cal], args.max_new_tokens):
                print(f"- {line}", flush=True)
        compiled = None
        for d, spec in pairs:
            if d != dtype:
                continue
            method, on_compiled = spec.removesuffix("@compiled"), spec.endswith("@compiled")
            if on_compiled and compiled is None:  # one compiled target per dtype (its graphs are shared)
                from tss_opt.decoding.compiled import CompiledTarget

                cm = rt.loaded.config
                compiled = CompiledTarget(rt.loaded.model, layers_path=cm.layers_path, max_context=cm.max_context)
            target = compiled if on_compiled else rt.target
            tag = f"{dtype}, compiled" if on_compiled else dtype
            if method == "plain":
                arms.append(Arm(f"ours: plain decoding ({tag})", "ours", "dense", engine_run(target, ()), dtype,
                                check=rt.target if on_compiled else None))
                if not on_compiled:
                    arms.append(Arm(f"ours: plain decoding ({tag})", "ours", sparse_label, engine_run(target, skip), dtype))
                continue
            label, over = DRAFTERS[method]
            cfg = OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / f"{over['name']}.yaml"), over)
            drafter = build_drafter(cfg, target, rt.loaded)  # sized from this target's own latency tables
            arms.append(Arm(f"ours: {label} ({tag})", "ours", "dense", engine_run(target, (), drafter), dtype, check=rt.target))
    return arms


def judge_lossless(arms: list[Arm], prompts: list[list[int]]) -> list[str]:
    """Each speculative arm's verdicts against our plain arm of its dtype on the same target."""
    plain = {(a.dtype, a.target): a for a in arms if a.engine == "ours" and a.check is None}
    failures = []
    for a in arms:
        if a.check is None:
            continue
        ref = plain.get((a.dtype, a.target))
        if ref is None:
            raise SystemExit(f"{a.label}: no {a.dtype}:plain arm to judge it against; add it to --ours")
        for i, (ids, want, got) in enumerate(zip(prompts, ref.tokens, a.tokens)):
            res = check_lossless(a.check, torch.tensor(ids), want, got)
            a.verdicts.append(res.verdict)
            if res.verdict == "diverged":
                failures.append(f"{a.label} on prompt {i + 1} diverged from plain decoding: {res.divergence}")
    return failures


def summarize(arms: list[Arm]) -> None:
    """The half-precision comparison in one line: our fastest arm against llama.cpp's fastest
    16-bit arm on the dense target (the issue's bar: at least as fast, goal 1.5x)."""
    dense = [a for a in arms if a.target == "dense"]
    half = [a for a in dense if a.engine == "llama.cpp" and any(t in a.label for t in ("bf16", "f16"))]
    mine = [a for a in dense if a.engine == "ours"]
    if not half or not mine:
        return
    best_llama = max(half, key=lambda a: statistics.median(a.tps))
    best_ours = max(mine, key=lambda a: statistics.median(a.tps))
    r = median_ratio(best_ours.tps, best_llama.tps)
    verdict = "met" if r >= 1.0 else "NOT met"
    print(f"\nhalf precision, dense: our fastest ({best_ours.label}, {statistics.median(best_ours.tps):.1f} tok/s) "
          f"{r:.2f}x llama.cpp's fastest 16-bit arm ({best_llama.label}, {statistics.median(best_llama.tps):.1f} tok/s): "
          f"at least as fast {verdict} (goal 1.5x)")


if __name__ == "__main__":
    main()
