"""What one default search costs, with and without early stopping and the reused dense prefill.

Runs the search command's function twice on one domain (same preset, same storage): once as
configured (``search.early_stopping=true``, ``reuse_prefill=true``: the defaults) and once with
both switched off, then reads both studies back and prints, side by side: trials, prompt
evaluations, generated tokens, prompt (prefill) forwards, the summed trial time, S* and the
validated choice. A study already in the storage is resumed, not re-run, so the figures come
from the stored trials (their own start/end times), not from this process's clock.

Example (the issue-10 measurement; about an hour on 2 shared cores)::

    python benchmarks/search_cost.py --domain qa --storage sqlite:////tmp/cost.db --threads 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARMS = {
    "early stop + prefill reuse (default)": [],
    "neither": ["search.early_stopping=false", "reuse_prefill=false"],
}


def study_cost(storage: str, study_name: str, reuse_prefill: bool) -> dict[str, object]:
    """Totals over a stored study's completed trials."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    tokens = prompts = 0
    seconds = 0.0
    for t in trials:
        per = t.user_attrs.get("per_prompt") or {}
        toks = per.get("tokens") or []
        tokens += int(sum(toks)) if toks else int(t.user_attrs.get("new_tokens", 0))
        prompts += int(t.user_attrs.get("prompts_used") or len(toks) or 0)
        if t.datetime_start and t.datetime_complete:
            seconds += (t.datetime_complete - t.datetime_start).total_seconds()
    distinct = max((len((t.user_attrs.get("per_prompt") or {}).get("tokens") or []) for t in trials), default=0)
    result = study.user_attrs.get("result") or {}
    validation = study.user_attrs.get("validation") or {}
    return {
        "trials": len(trials),
        "early stopped": sum(1 for t in trials if t.user_attrs.get("early_stopped")),
        "prompt evaluations": prompts,
        "generated tokens": tokens,
        # With reuse each prompt is prefilled once per worker; without, once per evaluation.
        "prefill forwards": distinct if reuse_prefill else prompts,
        "trial time (min)": round(seconds / 60, 1),
        "S*": result.get("best"),
        "validated": validation.get("chosen") if validation else "n/a",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", default="qa")
    p.add_argument("--storage", default=None, help="SQL URL (default: a temporary SQLite file)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for both arms")
    args = p.parse_args()

    import torch

    from tss_opt.assembly import compose_config, study_identity
    from tss_opt.cli.search import search

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="tss_cost_"))
    storage = args.storage or f"sqlite:///{tmp / 'cost.db'}"
    rows: dict[str, dict[str, object]] = {}
    for arm, extra in ARMS.items():
        overrides = [f"+domain={args.domain}", f"storage={storage}", f"mapping_path={tmp / 'mapping.yaml'}", *extra, *args.overrides]
        cfg = compose_config(overrides)
        name, _ = study_identity(cfg)
        print(f"## {arm}: study {name}", flush=True)
        search(cfg)
        rows[arm] = study_cost(storage, name, reuse_prefill="reuse_prefill=false" not in extra)

    keys = list(next(iter(rows.values())))
    print(f"\n### search cost, domain {args.domain} ({args.threads} thread(s))\n")
    print("| | " + " | ".join(rows) + " | ratio |")
    print("|---|" + "---|" * (len(rows) + 1))
    a, b = (rows[k] for k in ARMS)
    for k in keys:
        va, vb = a[k], b[k]
        ratio = f"{va / vb:.2f}" if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and vb else ""
        print(f"| {k} | {va} | {vb} | {ratio} |")
    same = a["S*"] == b["S*"]
    print(f"\nsame S*: {same}. Trial time: the sum of the stored trials' own durations (validation excluded).")


if __name__ == "__main__":
    main()
