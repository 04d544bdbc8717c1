"""Load on the OpenAI-compatible server: 1, 4 and 16 concurrent clients, embedded model.

    python benchmarks/serve_load.py [--requests 8] [--max-tokens 32] [--clients 1 4 16]
        [--mapping docs/results/mapping_cpu_preset.yaml] [--out docs/results/serve_load.txt]

Loads SmolLM2-135M once, serves it with the real server (uvicorn on a local socket, in this
process) and sends greedy chat requests labelled with mapped domains (a few short prompts)
from 1, 4 and 16 client threads over HTTP. Per level: requests/s, generated tokens/s,
p50/p95 latency, errors (target 0), and whether every response equals the same request
served alone (greedy: it must). The server's overhead is measured in pairs, so that load
from other processes on a shared machine hits both sides alike: each prompt through
``TSSController.generate`` in process, then the same request over HTTP by one client, repeated
``--pairs`` times; the median of the paired latency ratios minus 1 is the overhead (target
<= 5 %). The domain router is not fitted: every request is labelled.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tss_opt.assembly import compose_config  # noqa: E402
from tss_opt.runtime import TSSController  # noqa: E402
from tss_opt.runtime.server import ServerSettings, ServingState, uvicorn_config  # noqa: E402

PROMPTS = [
    ("qa", "Who wrote the play Hamlet?"),
    ("summarization", "Summarize: The city council voted on Tuesday to extend the bus line to the airport, citing rising demand from commuters and tourists."),
    ("translation", "Translate German to English: Das Haus ist alt, aber der Garten ist schön."),
    ("qa", "What is the capital of Australia?"),
]


@dataclass
class Outcome:
    latency: float
    tokens: int
    text: str | None  # None: an error


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run_level(url: str, clients: int, n_requests: int, max_tokens: int) -> tuple[float, list[tuple[int, Outcome]]]:
    """``n_requests`` spread over ``clients`` threads, each sending its share one by one."""
    jobs = list(range(n_requests))
    results: list[tuple[int, Outcome]] = []
    lock = threading.Lock()

    def client(idx: int) -> None:
        with httpx.Client(timeout=600) as http:
            for j in jobs[idx::clients]:
                domain, prompt = PROMPTS[j % len(PROMPTS)]
                body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                        "temperature": 0, "domain": domain}
                t0 = time.perf_counter()
                try:
                    r = http.post(url + "/v1/chat/completions", json=body)
                    ok = r.status_code == 200
                    data = r.json() if ok else None
                except httpx.HTTPError:
                    ok, data = False, None
                dt = time.perf_counter() - t0
                out = Outcome(dt, data["usage"]["completion_tokens"], data["choices"][0]["message"]["content"]) if ok and data else Outcome(dt, 0, None)
                with lock:
                    results.append((j, out))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=8, help="requests per concurrency level (at least the client count)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--mapping", default=str(REPO / "docs/results/mapping_cpu_preset.yaml"))
    ap.add_argument("--pairs", type=int, default=2, help="in-process/HTTP pairs per prompt for the overhead")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp())
    mapping = tmp / "mapping.yaml"
    shutil.copy(args.mapping, mapping)
    cfg = compose_config([f"mapping_path={mapping}", f"max_new_tokens={args.max_tokens}"])
    t0 = time.perf_counter()
    controller = TSSController.from_config(cfg, with_router=False)
    load_s = time.perf_counter() - t0

    # Each request alone, in process: the reference outputs and latencies.
    alone: dict[int, str] = {}
    inproc: list[float] = []
    for rep in range(2):  # the first pass warms up; the second is timed
        for j, (domain, prompt) in enumerate(PROMPTS):
            t = time.perf_counter()
            res = controller.generate([{"role": "user", "content": prompt}], domain, max_new_tokens=args.max_tokens)
            if rep:
                inproc.append(time.perf_counter() - t)
            alone[j] = res.text

    n_max = max(args.requests, max(args.clients))
    settings = ServerSettings(port=0, max_queue=max(16, n_max), max_tokens_cap=max(args.max_tokens, 64), served_model_name="smollm2")
    state = ServingState(controller, settings, "smollm2", str(mapping))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from dataclasses import replace

    state.settings = replace(settings, port=port)
    import uvicorn

    server = uvicorn.Server(uvicorn_config(state, "warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"

    lines = [
        f"serve_load: SmolLM2-135M (float32, CPU, {torch.get_num_threads()} torch threads), drafter {cfg.model.default_drafter}, "
        f"greedy chat requests of {args.max_tokens} new tokens, {len(PROMPTS)} prompts labelled qa/summarization/translation, "
        f"model loaded in {load_s:.1f}s",
        f"in process (TSSController.generate, each prompt alone): median latency {statistics.median(inproc):.3f}s",
        "",
        f"{'clients':>7} {'requests':>8} {'errors':>6} {'equal':>6} {'req/s':>7} {'tok/s':>7} {'p50 s':>7} {'p95 s':>7}",
    ]
    for clients in args.clients:
        n = max(args.requests, clients)
        wall, results = run_level(url, clients, n, args.max_tokens)
        ok = [o for _, o in results if o.text is not None]
        errors = len(results) - len(ok)
        equal = sum(o.text == alone[j % len(PROMPTS)] for j, o in results if o.text is not None)
        lat = [o.latency for o in ok]
        tokens = sum(o.tokens for o in ok)
        lines.append(
            f"{clients:>7} {n:>8} {errors:>6} {equal:>3}/{len(ok):<2} {len(ok) / wall:>7.2f} {tokens / wall:>7.1f} "
            f"{percentile(lat, 0.5):>7.2f} {percentile(lat, 0.95):>7.2f}"
        )
        print(lines[-1], flush=True)
    ratios, diffs = [], []
    with httpx.Client(timeout=600) as http:
        for _ in range(args.pairs):
            for domain, prompt in PROMPTS:
                msgs = [{"role": "user", "content": prompt}]
                t = time.perf_counter()
                controller.generate(msgs, domain, max_new_tokens=args.max_tokens)
                t_in = time.perf_counter() - t
                body = {"model": "smollm2", "messages": msgs, "max_tokens": args.max_tokens, "temperature": 0, "domain": domain}
                t = time.perf_counter()
                http.post(url + "/v1/chat/completions", json=body).raise_for_status()
                t_http = time.perf_counter() - t
                ratios.append(t_http / t_in)
                diffs.append(t_http - t_in)
    over = statistics.median(ratios) - 1
    lines += [
        "",
        f"server overhead at one client ({len(ratios)} pairs, each request in process then over HTTP): median ratio "
        f"{100 * over:+.1f} % (target <= 5 %), median difference {1000 * statistics.median(diffs):+.0f} ms per request",
    ]
    server.should_exit = True
    th.join(30)
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(f"$ python benchmarks/serve_load.py {' '.join(sys.argv[1:])}\n\n{report}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
