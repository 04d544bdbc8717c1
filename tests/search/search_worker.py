"""One search worker process for the multi-process tests (also runnable by hand).

Usage: ``python tests/search/search_worker.py --storage URL --study NAME --log FILE --out FILE``
with ``PYTHONPATH=<repo>:<repo>/tests/search``. Writes the result as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from search_landscape import Landscape

from tss_opt.search import run_search


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--study", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.1)
    p.add_argument("--heartbeat", type=int, default=10)
    p.add_argument("--grace", type=int, default=30)
    p.add_argument("--mode", default="exhaustive")
    p.add_argument("--max-depth", type=int, default=5)
    p.add_argument("--kill-on", action="append", default=[], help="e.g. 2 or 1,3")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(process)d %(name)s %(message)s"
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    land = Landscape(
        args.layers,
        args.seed,
        sleep=args.sleep,
        log_path=args.log,
        kill_on=[[int(x) for x in k.split(",")] for k in args.kill_on],
    )
    result = run_search(
        land,
        storage=args.storage,
        study_name=args.study,
        mode=args.mode,
        max_depth=args.max_depth,
        heartbeat_interval=args.heartbeat,
        grace_period=args.grace,
        n_workers_hint=3,
        metadata={"model": "synthetic", "domain": "qa", "drafter": "none", "split": "calibration"},
    )
    with open(args.out, "w") as f:
        json.dump(
            {
                "best": sorted(result.best),
                "pareto": sorted(sorted(c) for c in result.pareto),
                "evaluated": sorted(sorted(c) for c in result.evaluated),
                "pool": list(result.pool),
                "levels": [[lv.level, lv.evaluated, lv.feasible] for lv in result.levels],
                "calls": land.calls,
            },
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
