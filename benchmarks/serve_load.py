"""Our server against ``transformers serve DIR --continuous-batching`` under 1, 4 and 16
concurrent clients (issue 31): same model, same requests, same threads, one run.

    python benchmarks/serve_load.py         # the issue's load (below): about 10 min on 2 quiet cores
    python benchmarks/serve_load.py --clients 1 4 --requests 1 --max-tokens 8     # a smoke run
    python benchmarks/serve_load.py --servers ours --ours-arg drafter.num_tokens=auto

The load: ``--requests`` (2) chat requests per client at the largest client count (16), i.e.
32 requests, drawn in turn from the held-out prompts of summarization, qa and mmlu (the
shipped domain data, each domain's system prompt as a system message when it has one),
``--max-tokens`` (32) new tokens, temperature 0, sent with the official ``openai`` client
(no retries). Every level sends these same requests, spread over its clients (client c sends
requests c, c + C, ...), so the levels differ only in concurrency; 1 client sends them one
after another, which is also each request's solo answer.

Each server runs as its own process on a free loopback port, one after the other, on the same
float32 checkpoint (the embedded SmolLM2-135M, converted once by tss_opt into
``storage/models``) and the same CPU threads (``--threads``, default torch's: OMP_NUM_THREADS
for both, ``threads=`` for ours). Ours: ``python -m tss_opt.cli.serve`` with the mapping
(``--mapping``, default the committed CPU preset: mmlu on skip set [3, 14]) and its default
drafter, each request labelled with ``extra_body={"domain": ...}``; settings through
``--ours-arg KEY=VALUE``. The peer: ``transformers serve DIR --continuous-batching --device
cpu --dtype float32``, unlabelled; its own flags through ``--peer-arg=--cb-num-blocks=64``.
One untimed request warms each server up first (the peer builds its batching cache then).

Per server and level: requests, errors (target 0), outputs equal to the same request served
alone by the same server (greedy: every one must), requests/s, generated tokens/s (tokens in
``usage`` over the level's wall time), p50/p95 latency. Then ratios: ours / peer at each
level, each server at the most clients against itself at 1 client, with the issue's targets;
and, for information, how many solo answers of ours equal the peer's (ours runs mapped skip
sets, which may change a domain's answers; dense domains should match).

Needs the peer's serving extras: ``pip install "transformers[serving]"`` (the script says so
when they are missing). Server logs, the mapping copy and the router cache go to
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
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import _servers  # noqa: E402

# Ours needs the key when the environment sets one (it inherits the environment); the peer
# ignores it.
API_KEY = os.environ.get("TSS_API_KEY") or "unused"
TARGET_VS_PEER, GOAL_VS_PEER, TARGET_VS_ONE = 1.0, 1.5, 2.0  # issue 31, at the most clients


@dataclass(frozen=True)
class Request:
    """One chat request of the load.

    Attributes:
        index: Its place in the load (the client that sends it: ``index % clients``).
        domain: The domain its prompt comes from (ours gets it as the label).
        messages: The chat messages, the domain's system prompt first when it has one.
    """

    index: int
    domain: str
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Outcome:
    """What one request got back.

    Attributes:
        index: The request's index.
        latency: Seconds from sending to the full answer.
        tokens: Generated tokens (``usage.completion_tokens``).
        text: The answer; ``None`` for an error.
        error: The error's kind and message; ``None`` when answered.
        skip_set: The skip set ours reported in ``tss`` (``None`` for the peer).
    """

    index: int
    latency: float
    tokens: int
    text: str | None
    error: str | None = None
    skip_set: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Level:
    """One server at one concurrency level."""

    server: str
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


def build_requests(domains: list[str], n: int, split: str) -> list[Request]:
    """``n`` requests, domains in turn, each domain's ``split`` prompts in order."""
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir
    from tss_opt.evaluation.domains import available_domains, load_domain

    known = available_domains([config_dir()])
    unknown = [d for d in domains if d not in known]
    if unknown or not domains:
        raise SystemExit(f"--domains {','.join(domains)}: unknown {unknown or '(none given)'}; shipped: {', '.join(known)}")
    loaded = [load_domain(OmegaConf.load(config_dir() / "domain" / f"{d}.yaml")) for d in domains]
    pools = [dom.split(split) for dom in loaded]  # type: ignore[arg-type]
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


def send(client: Any, model: str, req: Request, max_tokens: int, labelled: bool) -> Outcome:
    """One chat completion; any failure is an outcome (the benchmark counts errors)."""
    extra = {"domain": req.domain} if labelled else None
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


def run_level(url: str, model: str, reqs: list[Request], clients: int, max_tokens: int, labelled: bool) -> tuple[float, list[Outcome]]:
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
            out = send(api, model, req, max_tokens, labelled)
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
        f"{level.server:<6} {level.clients:>7} {len(level.outcomes):>8} {len(level.outcomes) - len(ok):>6} "
        f"{equal:>10} {len(ok) / level.wall:>7.2f} {level.tokens_per_s:>7.1f} {percentile(lat, 0.5):>7.2f} "
        f"{percentile(lat, 0.95):>7.2f} {level.wall:>7.1f}"
    )


HEADER = (
    f"{'server':<6} {'clients':>7} {'requests':>8} {'errors':>6} {'equal solo':>10} {'req/s':>7} "
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


def serve_levels(spec: _servers.ServerSpec, reqs: list[Request], levels: list[int], max_tokens: int) -> list[Level]:
    """Start one server, warm it up, run every level (1 client first), stop it."""
    from openai import OpenAI

    t0 = time.perf_counter()
    with _servers.running(spec) as url:
        ready = time.perf_counter() - t0
        model = spec.model or OpenAI(base_url=url + "/v1", api_key=API_KEY).models.list().data[0].id
        labelled = spec.name == "ours"
        t1 = time.perf_counter()
        warm = send(OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=3600), model, reqs[0], max_tokens, labelled)
        if warm.error:
            raise SystemExit(f"{spec.name}: the warm-up request failed: {warm.error} (log: {spec.log})")
        print(f"{spec.name}: ready in {ready:.1f} s, warm-up request {time.perf_counter() - t1:.1f} s, load average {loadavg()}", flush=True)
        out: list[Level] = []
        for clients in levels:
            wall, outcomes = run_level(url, model, reqs, clients, max_tokens, labelled)
            out.append(Level(spec.name, clients, wall, outcomes))
            print(row(out[-1], solo_texts(out)), flush=True)
    print(f"{spec.name}: done, load average {loadavg()}", flush=True)
    return out


def ratio_lines(results: dict[str, list[Level]], reqs: list[Request]) -> list[str]:
    """Ours / peer per level, each server at the most clients / at 1, ours' answers vs the peer's."""
    lines = []
    ours, peer = results.get("ours"), results.get("peer")
    if ours and peer:
        lines.append("ours / peer at each level: tokens/s and p50 latency (peer's / ours': above 1 is ours faster)")
        top = max(lv.clients for lv in ours)
        for a, b in zip(ours, peer):
            tgt = f"  (target >= {TARGET_VS_PEER:g}x, goal {GOAL_VS_PEER:g}x)" if a.clients == top else ""
            lines.append(
                f"  {a.clients:>3} client{'s' if a.clients > 1 else ' '}: tokens/s "
                f"{times(a.tokens_per_s, b.tokens_per_s)}, p50 {times(b.p50, a.p50)}{tgt}"
            )
    for name, levels in results.items():
        one, top_level = levels[0], levels[-1]
        if top_level.clients > 1:
            tgt = f"  (target >= {TARGET_VS_ONE:g}x)" if name == "ours" else ""
            lines.append(
                f"{name} at {top_level.clients} clients vs {name} at 1: tokens/s "
                f"{times(top_level.tokens_per_s, one.tokens_per_s)}{tgt}"
            )
    if ours and peer:
        a = {o.index: o.text for o in ours[0].ok}
        b = {o.index: o.text for o in peer[0].ok}
        by_domain: dict[str, list[bool]] = defaultdict(list)
        for r in reqs:
            if r.index in a and r.index in b:
                by_domain[r.domain].append(a[r.index] == b[r.index])
        total = sum(sum(v) for v in by_domain.values())
        parts = ", ".join(f"{d} {sum(v)}/{len(v)}" for d, v in by_domain.items())
        lines.append(
            f"ours' solo answers equal the peer's (informational; mapped domains run sparse): "
            f"{total}/{sum(len(v) for v in by_domain.values())} ({parts})"
        )
    if ours:
        sets: dict[str, set[tuple[int, ...] | None]] = defaultdict(set)
        for lv in ours:
            for o in lv.ok:
                sets[reqs[o.index].domain].add(o.skip_set)
        shown = "; ".join(
            f"{d} {' / '.join('dense' if not s else str(list(s)) for s in sorted(v, key=lambda s: s or ()))}"
            for d, v in sets.items()
        )
        lines.append(f"skip sets ours reported: {shown}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrency levels (1 always runs: the solo reference)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client at the largest level; every level sends requests x max(clients)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--domains", default="summarization,qa,mmlu", help="prompts drawn in turn from these shipped domains")
    ap.add_argument("--split", default="heldout", choices=["calibration", "validation", "heldout"])
    ap.add_argument("--mapping", default=str(REPO / "docs/results/mapping_cpu_preset.yaml"), help="ours' mapping")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of both servers (default: torch's)")
    ap.add_argument("--servers", nargs="+", default=["ours", "peer"], choices=["ours", "peer"])
    ap.add_argument("--ours-arg", action="append", default=[], help="a KEY=VALUE setting for ours (repeatable)")
    ap.add_argument("--peer-arg", action="append", default=[], help="a flag for transformers serve, e.g. --peer-arg=--cb-num-blocks=64")
    ap.add_argument("--workdir", default=str(REPO / "storage/serve_load"), help="server logs, mapping copy, router cache")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    command = "$ python benchmarks/serve_load.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(command, flush=True)
    for bad in [c for c in args.clients if c < 1] + ([args.requests] if args.requests < 1 else []) + (
        [args.max_tokens] if args.max_tokens < 1 else []
    ):
        raise SystemExit(f"--clients, --requests and --max-tokens take integers >= 1, got {bad}")
    if "peer" in args.servers and (why := _servers.peer_missing()):
        raise SystemExit(f"serve_load: {why} (or run ours alone with --servers ours)")
    if not Path(args.mapping).is_file():
        raise SystemExit(f"--mapping {args.mapping}: no such file; give a mapping YAML (docs/mapping.md)")
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
    cache_dir = REPO / "storage" / "models"
    checkpoint = _servers.checkpoint_dir(cache_dir)
    reqs = build_requests(domains, args.requests * max(levels), args.split)
    ours_extra = list(args.ours_arg)
    if max(levels) > 16 and not any(a.startswith("max_queue=") for a in ours_extra):
        ours_extra.append(f"max_queue={max(levels)}")  # the default 16 would answer 429 beyond
    # Ports are picked right before each start: the peer starts minutes after ours.
    make = {
        "ours": lambda port: _servers.ours_spec(
            port, mapping, cache_dir, args.max_tokens, threads, ours_extra, work / "ours.log"
        ),
        "peer": lambda port: _servers.peer_spec(port, checkpoint, threads, args.peer_arg, work / "peer.log"),
    }
    counts = ", ".join(f"{d} {sum(r.domain == d for r in reqs)}" for d in domains)
    lines = [
        f"serve_load: SmolLM2-135M float32 on CPU ({cpu_name()}, {os.cpu_count()} logical CPUs), "
        f"{threads} thread(s) per server; torch {version('torch')}, transformers {version('transformers')}, "
        f"openai {version('openai')}",
        f"load: {len(reqs)} chat requests ({counts}; {args.split} prompts) at every level, spread over "
        f"{', '.join(map(str, levels))} clients; {args.max_tokens} new tokens, temperature 0; "
        f"load average {loadavg()}",
    ]
    for line in lines:
        print(line, flush=True)
    t0 = time.perf_counter()
    results, commands = {}, []
    for n in args.servers:
        spec = make[n](_servers.free_port())
        commands.append(f"{n}: {spec.shown}")
        print(f"{commands[-1]}\n{HEADER}", flush=True)
        results[n] = serve_levels(spec, reqs, levels, args.max_tokens)
    table = [HEADER] + [row(lv, solo_texts(results[n])) for n in args.servers for lv in results[n]]
    errors = [
        f"  {lv.server} at {lv.clients} clients, request {o.index}: {o.error}"
        for n in args.servers for lv in results[n] for o in lv.outcomes if o.error
    ]
    report = [
        *lines, *commands, "", *table, "",
        *ratio_lines(results, reqs),
        *(["errors (first 5):", *errors[:5]] if errors else []),
        f"run took {time.perf_counter() - t0:.0f} s; load average at the end {loadavg()}",
    ]
    print()
    print("\n".join(report))
    if args.out:
        Path(args.out).write_text(f"{command}\n\n" + "\n".join(report) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
