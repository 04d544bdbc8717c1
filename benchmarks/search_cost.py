"""What one search costs with each trial evaluator, with and without futility stopping.

Runs the search command's own function once per arm and domain, each arm in its own SQLite
file (so no arm resumes another's study), and prints per domain, side by side: the search's
wall time (model load, baseline, trials and validation), generated tokens,
prompt evaluations, trials, trials stopped early, S*, the validated choice and the mapping
entry written, with each figure's ratio to the engine arm. Arms:

- ``engine``: real speculative decoding per trial (``evaluator=engine``);
- ``replay``: one batched greedy generation per trial plus a drafter replay
  (``evaluator=replay search.group_size=1``);
- ``grouped``: the replay of several queued trials in one batched generation, one skip set
  per batch row (``evaluator=replay``, the default ``search.group_size``);

each with the defaults (futility stopping on) and, as ``<arm> no-futility``, with
``search.futility_stopping=false``.

    python benchmarks/search_cost.py                                   # summarization + qa, six arms
    python benchmarks/search_cost.py --domains qa --arms "replay,grouped no-futility"  # a subset

Arms run in the order given, one domain after the other, on one thread by default (the
figures of a shared machine are noisy: compare ratios, not absolute seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NO_FUTILITY = ["search.futility_stopping=false"]
ARMS: dict[str, list[str]] = {
    "engine": ["evaluator=engine"],
    "engine no-futility": ["evaluator=engine", *NO_FUTILITY],
    "replay": ["evaluator=replay", "search.group_size=1"],
    "replay no-futility": ["evaluator=replay", "search.group_size=1", *NO_FUTILITY],
    "grouped": ["evaluator=replay"],
    "grouped no-futility": ["evaluator=replay", *NO_FUTILITY],
}
SHORT = {"engine": "engine", "replay": "replay", "grouped": "grouped"}


def study_cost(storage: str, study_name: str) -> dict[str, object]:
    """Totals over a stored study's completed trials, and its result."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    tokens = prompts = 0
    for t in trials:
        per = t.user_attrs.get("per_prompt") or {}
        toks = per.get("tokens") or []
        tokens += int(sum(toks)) if toks else int(t.user_attrs.get("new_tokens", 0))
        prompts += int(t.user_attrs.get("prompts_used") or len(toks) or 0)
    result = study.user_attrs.get("result") or {}
    validation = study.user_attrs.get("validation") or {}
    return {
        "trials": len(trials),
        "stopped early": sum(1 for t in trials if t.user_attrs.get("early_stopped")),
        "prompt evaluations": prompts,
        "generated tokens": tokens,
        "S*": result.get("best"),
        "validated": validation.get("chosen") if validation else "n/a",
    }


def mapping_entry(path: Path, domain: str) -> object:
    """The skip set the arm's mapping gives ``domain`` (``None``: no entry)."""
    import yaml

    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    entry = (data.get("domains") or {}).get(domain)
    return entry.get("skip_set") if isinstance(entry, dict) else None


def run_arm(domain: str, arm: str, workdir: Path, extra: list[str]) -> dict[str, object]:
    from tss_opt.assembly import compose_config, study_identity
    from tss_opt.cli.search import search

    tag = arm.replace(" ", "_")
    storage = f"sqlite:///{workdir / f'{domain}-{tag}.db'}"
    mapping = workdir / f"{domain}-{tag}-mapping.yaml"
    cfg = compose_config([f"+domain={domain}", f"storage={storage}", f"mapping_path={mapping}", *ARMS[arm], *extra])
    name, _ = study_identity(cfg)
    print(f"## {domain} / {arm}: study {name}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    search(cfg)
    wall = time.perf_counter() - t0
    row: dict[str, object] = {"search wall (min)": round(wall / 60, 2)}
    row.update(study_cost(storage, name))
    row["mapping entry"] = mapping_entry(mapping, domain)
    print(f"## {domain} / {arm}: {row}", file=sys.stderr, flush=True)
    return row


def print_table(domain: str, rows: dict[str, dict[str, object]]) -> None:
    keys = list(next(iter(rows.values())))
    ref = rows.get("engine")
    print(f"\n### {domain}\n")
    print("| | " + " | ".join(rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for k in keys:
        cells = []
        for row in rows.values():
            v = row[k]
            cell = str(v)
            r = ref[k] if ref else None
            if ref is not None and isinstance(v, (int, float)) and isinstance(r, (int, float)) and r and row is not ref:
                cell += f" ({v / r:.2f}x)"
            cells.append(cell)
        print(f"| {k} | " + " | ".join(cells) + " |")
    same = {str(r["mapping entry"]) for r in rows.values()}
    print(f"\nsame mapping entry in every arm: {len(same) == 1} ({', '.join(sorted(same))}); "
          "ratios are to the engine arm.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domains", default="summarization,qa")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from: {', '.join(ARMS)}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workdir", default=None, help="folder for the arms' SQLite files (default: a new temp folder)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm")
    args = p.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        p.error(f"unknown arm(s) {bad}; expected some of: {', '.join(ARMS)}")

    import torch

    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tss_cost_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"search cost per evaluator; {args.threads} torch thread(s); CPU preset defaults; overrides: "
          f"{args.overrides or 'none'}; storage {workdir}")
    for domain in args.domains.split(","):
        rows = {arm: run_arm(domain, arm, workdir, args.overrides) for arm in arms}
        print_table(domain, rows)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
