"""Trial throughput of the search engine with several worker processes.

Each run searches a fresh study with an evaluator that only sleeps ``--trial-seconds``: the
dense baseline, then ``--layers`` single-layer skips (all feasible; ``--depth 2`` adds the
pairs). Workers are separate processes that start together (a go-file releases them once
all have imported everything and opened the storage). Throughput is measured on the
evaluations after the baseline, from the workers' own clocks: evaluations / (last end -
first start). The ideal for N workers is N x the single-worker rate on the same storage;
efficiency = measured / ideal.

Example (quick)::

    python benchmarks/search.py --workers 1,2,4,8 --trial-seconds 0.2 --layers 24

PostgreSQL and MySQL URLs default to the development servers (``--postgres-url``,
``--mysql-url``); ``--storages sqlite,postgresql,mysql`` picks the backends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"


class Sleeper:
    """Every skip set is feasible and costs ``seconds`` of wall time; logs its own timing."""

    metric_name = "metric"

    def __init__(self, num_layers: int, seconds: float, log: Path) -> None:
        self.num_layers = num_layers
        self.seconds = seconds
        self.log = log

    def __call__(self, skip: frozenset[int]) -> dict[str, float]:
        start = time.time()
        time.sleep(self.seconds)
        end = time.time()
        with open(self.log, "a") as f:
            f.write(json.dumps({"k": len(skip), "start": start, "end": end}) + "\n")
        # Skipping helps a little, so every set stays feasible and the search goes deep.
        return {
            "accept_length": 3.0 + 0.001 * len(skip),
            "metric": 0.5,
            "cost": 1.0 - 0.01 * len(skip),
        }


def worker_main(args: argparse.Namespace) -> int:
    import logging

    import optuna

    from tss_opt.search import run_search
    from tss_opt.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("tss_opt").setLevel(logging.WARNING)
    storage = open_storage(args.storage)
    Path(args.ready).touch()
    while not Path(args.go).exists():
        time.sleep(0.005)
    run_search(
        Sleeper(args.layers, args.trial_seconds, Path(args.log)),
        storage=storage,
        study_name=args.study,
        max_depth=args.depth,
        show_progress=False,
    )
    return 0


def run_once(storage: str, workers: int, args: argparse.Namespace, tmp: Path) -> dict:
    study = f"bench-{uuid.uuid4().hex[:10]}"
    run_dir = tmp / study
    run_dir.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    procs = []
    for i in range(workers):
        cmd = [
            sys.executable, __file__, "--worker",
            "--storage", storage, "--study", study,
            "--layers", str(args.layers), "--depth", str(args.depth),
            "--trial-seconds", str(args.trial_seconds),
            "--log", str(run_dir / f"w{i}.jsonl"),
            "--ready", str(run_dir / f"ready{i}"), "--go", str(run_dir / "go"),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True))
    while not all((run_dir / f"ready{i}").exists() for i in range(workers)):
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.01)
    (run_dir / "go").touch()
    for p in procs:
        _, err = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            raise SystemExit(f"worker failed on {storage}:\n{err[-3000:]}")
    events = [
        json.loads(line) for f in run_dir.glob("w*.jsonl") for line in f.read_text().splitlines()
    ]
    timed = [e for e in events if e["k"] >= 1]
    span = max(e["end"] for e in timed) - min(e["start"] for e in timed)
    _cleanup(storage, study)
    return {"trials": len(timed), "span": span, "rate": len(timed) / span, "all": len(events)}


def _cleanup(storage: str, study: str) -> None:
    import optuna

    try:
        optuna.delete_study(study_name=study, storage=storage)
    except KeyError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts")
    p.add_argument("--storages", default="sqlite,postgresql", help="sqlite, postgresql, mysql")
    p.add_argument("--trial-seconds", type=float, default=0.5, help="evaluator duration")
    p.add_argument("--layers", type=int, default=32, help="level-1 size (trials after baseline)")
    p.add_argument("--depth", type=int, default=1, help="1: singles; 2: also all pairs")
    p.add_argument("--postgres-url", default=POSTGRES_URL)
    p.add_argument("--mysql-url", default=MYSQL_URL)
    p.add_argument("--timeout", type=float, default=900)
    # Internal: one worker process.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--storage", "--study", "--log", "--ready", "--go"):
        p.add_argument(name, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)

    counts = [int(x) for x in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tss-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for kind in args.storages.split(","):
            base_rate = None
            for n in counts:
                if kind == "sqlite":
                    url = f"sqlite:///{tmp / f'bench-{n}.db'}"
                else:
                    url = {"postgresql": args.postgres_url, "mysql": args.mysql_url}[kind]
                r = run_once(url, n, args, tmp)
                if base_rate is None:
                    base_rate = r["rate"] / n  # per-worker rate of the first (smallest) run
                ideal = n * base_rate
                rows.append((kind, n, r["trials"], r["span"], r["rate"], ideal, r["rate"] / ideal))
                print(f"  {kind} x{n}: {r['rate']:.2f} trials/s", file=sys.stderr, flush=True)
    ceiling = 1.0 / args.trial_seconds
    print(
        f"\nSearch throughput, evaluator = sleep {args.trial_seconds} s "
        f"(pure-evaluation ceiling {ceiling:.2f} trials/s per worker), "
        f"{args.layers} level-1 trials{' + pairs' if args.depth > 1 else ''}, baseline excluded"
    )
    header = f"{'storage':<11}{'workers':>8}{'trials':>8}{'span s':>9}{'trials/s':>10}{'ideal':>9}{'efficiency':>12}"
    print(header)
    print("-" * len(header))
    for kind, n, trials, span, rate, ideal, eff in rows:
        print(f"{kind:<11}{n:>8}{trials:>8}{span:>9.2f}{rate:>10.2f}{ideal:>9.2f}{eff:>12.2f}")
    print("ideal = workers x the 1-worker rate on the same storage; efficiency = trials/s / ideal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
