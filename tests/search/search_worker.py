"""One search worker process for the multi-process tests (also runnable by hand).

Usage: ``python tests/search/search_worker.py --storage URL --study NAME --log FILE --out FILE``
with ``PYTHONPATH=<repo>:<repo>/tests/search``. Writes the result as JSON to ``--out``.

Ctrl-C ends it as the commands end (``tss_opt.cli.common``): the one interrupt line, exit 130,
Optuna's interrupted-trial warning dropped. ``--fault`` arms a real signal at one storage write
(see :func:`arm_fault`); ``--ready FILE`` is touched when the search starts.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tss_opt.cli.common import EXIT_INTERRUPTED, INTERRUPTED, QuietInterrupt, interrupted_by

SIGNALS = {"sigint": signal.SIGINT, "sigstop": signal.SIGSTOP}


def arm_fault(spec: str) -> None:
    """Send this process a real signal at one storage write, once.

    ``spec`` is ``SIGNAL:METHOD:WHEN:MATCH``: ``SIGNAL`` ``sigint`` or ``sigstop``; ``METHOD``
    an ``RDBStorage`` method; ``WHEN`` ``before`` or ``after`` calling through; ``MATCH``
    what the call must carry: for ``set_trial_state_values`` the new state and the trial's
    skip set (``COMPLETE@2`` or ``RUNNING@2``), for ``set_trial_user_attr`` the key and skip
    set (``feasible@2``), for ``set_study_user_attr`` the key (``num_layers``).
    """
    from optuna.storages import RDBStorage

    sig, method, when, match = spec.split(":")
    what, _, skip = match.partition("@")
    if method == "evaluator":  # inside the evaluator of skip set MATCH, every run
        from search_landscape import Landscape

        call = Landscape.__call__

        def evaluate(self: Landscape, config: frozenset[int]) -> dict[str, Any]:
            if sorted(config) == [int(x) for x in match.split(",") if x]:
                os.kill(os.getpid(), SIGNALS[sig])
            return call(self, config)

        Landscape.__call__ = evaluate  # type: ignore[method-assign]
        return
    original = getattr(RDBStorage, method)
    fired = False

    signature = inspect.signature(original)

    def matches(self: RDBStorage, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        call = signature.bind(self, *args, **kwargs).arguments
        if method == "set_study_user_attr":
            return call["key"] == what
        key = call["state"].name if "state" in call else call.get("key", call.get("param_name"))
        if key != what:
            return False
        stored = self.get_trial(call["trial_id"]).user_attrs.get("skip_set")
        return stored == [int(x) for x in skip.split(",") if x]

    def wrapped(self: RDBStorage, *args: Any, **kwargs: Any) -> Any:
        nonlocal fired
        fire = not fired and matches(self, args, kwargs)
        if fire and when == "before":
            fired = True
            os.kill(os.getpid(), SIGNALS[sig])
        out = original(self, *args, **kwargs)
        if fire and when == "after":
            fired = True
            os.kill(os.getpid(), SIGNALS[sig])
        return out

    setattr(RDBStorage, method, wrapped)


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
    p.add_argument("--fault", default=None, help="SIGNAL:METHOD:WHEN:MATCH (see arm_fault)")
    p.add_argument("--ready", default=None, help="a file touched when the search starts")
    p.add_argument("--group-size", type=int, default=1, help="> 1: a GroupLandscape, grouped claims")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(process)d %(name)s %(message)s"
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(QuietInterrupt())
    if args.fault:
        arm_fault(args.fault)
    if args.ready:
        Path(args.ready).touch()
    from search_landscape import GroupLandscape, Landscape

    from tss_opt.search import run_search

    land = (GroupLandscape if args.group_size > 1 else Landscape)(
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
        group_size=args.group_size,
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
                "groups": [len(g) for g in getattr(land, "groups", [])],
            },
            f,
        )
    # Done: a Ctrl-C from here to the process's end (interpreter shutdown, outside the handler
    # below) would end it by the signal (exit -2); the CLI does the same (cli/common.py).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException as e:  # Ctrl-C, also wrapped as during a lazy import (interrupted_by)
        if not interrupted_by(e):
            raise
        print(INTERRUPTED, file=sys.stderr)
        code = EXIT_INTERRUPTED
    sys.exit(code)
