"""The configurations whose study names are pinned (tests/search/test_study_names.py).

Each case is a label and the command-line overrides a user would type. The matrix covers
every search mode and preset, every shipped drafter and domain, both relaxed rules and
exact verification, compile on/off, every evaluator kind (and a custom factory), dtypes,
scope, cost, split, prompt counts and generation lengths, alone and combined.

``python tests/search/study_name_cases.py`` prints the table the test pins (run it on the
code whose names are to be kept, never to "fix" a failing test).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

BASE = ["+domain=summarization"]

MODES = ("exhaustive", "beam", "sleb", "gm_skip", "random", "accept_only", "metric_only", "tpe", "nsga2", "gp")
DRAFTERS = ("pld", "samd", "token_recycle", "eagle", "draft_model", "self", "t2d", "routed", "merged")
DOMAINS = ("summarization", "qa", "translation", "mmlu", "rag")


def cases() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = [("readme_first_command", list(BASE))]
    out += [(f"domain={d}", [f"+domain={d}"]) for d in DOMAINS]
    out += [(f"search={p}", [*BASE, f"search={p}"]) for p in ("cpu", "paper", "algorithm1")]
    for m in MODES:
        out.append((f"mode={m}", [*BASE, "search=paper", f"search.mode={m}", "search.max_trials=20"]))
    out += [
        ("mode=random seed=3", [*BASE, "search.mode=random", "search.seed=3"]),
        ("mode=tpe seed=5", [*BASE, "search.mode=tpe", "search.seed=5"]),
        ("mode=beam seed=3 (not seeded)", [*BASE, "search.mode=beam", "search.seed=3"]),
        ("mode=sleb sleb_score=accept_length", [*BASE, "search.mode=sleb", "search.sleb_score=accept_length"]),
        ("mode=gm_skip sleb_score=accept_length", [*BASE, "search.mode=gm_skip", "search.sleb_score=accept_length"]),
    ]
    out += [(f"drafter={d}", [*BASE, f"drafter={d}"]) for d in DRAFTERS]
    out += [
        ("drafter=samd fallback=none", [*BASE, "drafter=samd", "+drafter.fallback=none"]),
        ("drafter=pld num_tokens=5", [*BASE, "drafter=pld", "drafter.num_tokens=5"]),
    ]
    out += [
        ("verification=exact", [*BASE, "verification=exact"]),
        ("verification=diversed", [*BASE, "drafter=eagle", "verification=diversed"]),
        ("verification=diversed w=0.6", [*BASE, "drafter=eagle", "verification=diversed", "relaxed.weight=0.6"]),
        ("verification=diversed weight_policy", [*BASE, "drafter=eagle", "verification=diversed", "relaxed.weight_policy=storage/relaxed/w.json"]),
        ("verification=cospec", [*BASE, "drafter=draft_model", "verification=cospec"]),
        ("verification=cospec taus", [*BASE, "drafter=draft_model", "verification=cospec", "relaxed.tau_draft=0.5", "relaxed.tau_target=0.2"]),
        ("verification=cospec policy", [*BASE, "drafter=draft_model", "verification=cospec", "relaxed.policy=storage/relaxed/p.json"]),
        ("exact with relaxed.weight=0.6 (unused)", [*BASE, "relaxed.weight=0.6"]),
        ("verification=diversed pld (identity only)", [*BASE, "verification=diversed"]),
    ]
    out += [
        ("compile=true", [*BASE, "compile=true"]),
        ("compile=false", [*BASE, "compile=false"]),
        ("evaluator=auto", [*BASE, "evaluator=auto"]),
        ("evaluator=engine", [*BASE, "evaluator=engine"]),
        ("evaluator=replay", [*BASE, "evaluator=replay"]),
        ("evaluator=replay batch_size=16", [*BASE, "evaluator=replay", "evaluator.batch_size=16"]),
        ("evaluator=auto batch_size=4", [*BASE, "evaluator.batch_size=4"]),
        ("evaluator._target_=custom", [*BASE, "evaluator._target_=mypkg.make_evaluator"]),
        ("evaluator=engine _target_=custom", [*BASE, "evaluator=engine", "evaluator._target_=mypkg.evals.build_evaluator"]),
        ("dtype=bfloat16", [*BASE, "dtype=bfloat16"]),
        ("dtype=float16", [*BASE, "dtype=float16"]),
        ("dtype=float64", [*BASE, "dtype=float64"]),
        ("model.dtype=bfloat16", [*BASE, "model.dtype=bfloat16"]),
        ("device=cpu", [*BASE, "device=cpu"]),
        ("scope=all", [*BASE, "scope=all"]),
        ("cost=measured", [*BASE, "cost=measured"]),
        ("temperature=0.7", [*BASE, "temperature=0.7"]),
        ("split=validation", [*BASE, "split=validation"]),
        ("split=heldout", [*BASE, "split=heldout"]),
        ("prompts=4", [*BASE, "search.prompts=4"]),
        ("prompts=100 (capped)", [*BASE, "search.prompts=100"]),
        ("prompts=null", [*BASE, "search.prompts=null"]),
        ("max_new_tokens=8", [*BASE, "max_new_tokens=8"]),
        ("search.max_new_tokens=12", [*BASE, "search.max_new_tokens=12"]),
        ("both lengths", [*BASE, "max_new_tokens=8", "search.max_new_tokens=12"]),
        ("search=paper lengths from domain", [*BASE, "search=paper"]),
        ("reuse_prefill=false", [*BASE, "reuse_prefill=false"]),
        ("prefill_store_gib=1", [*BASE, "prefill_store_gib=1"]),
        ("group_size=1", [*BASE, "search.group_size=1"]),
        ("selection=triple_win", [*BASE, "search.selection=triple_win"]),
        ("validation_candidates=0", [*BASE, "search.validation_candidates=0"]),
        ("eps_metric_abs=0", [*BASE, "search.eps_metric_abs=0"]),
        ("eps_metric_abs=0.01", [*BASE, "search.eps_metric_abs=0.01"]),
        ("eps_metric=0.1", [*BASE, "search.eps_metric=0.1"]),
        ("relative=false", [*BASE, "search.relative=false", "search.eps_accept=0.1", "search.eps_metric=0.01"]),
        ("feasibility=point", [*BASE, "search.feasibility=point"]),
        ("early_stopping=false", [*BASE, "search.early_stopping=false"]),
        ("futility_stopping=false", [*BASE, "search.futility_stopping=false"]),
        ("max_depth=2 beam_width=4", [*BASE, "search.max_depth=2", "search.beam_width=4"]),
        ("barriers", [*BASE, "search.early_barrier=0", "search.latter_barrier=0"]),
        ("study_name given", [*BASE, "study_name=mine"]),
        ("model=tiny", [*BASE, "+model=tiny"]),
    ]
    out += [
        ("combo lossy engine", [
            "+domain=qa", "search=paper", "drafter=eagle", "verification=diversed", "relaxed.weight=0.8",
            "evaluator=engine", "compile=true", "dtype=bfloat16", "scope=all", "cost=measured",
        ]),
        ("combo replay", [
            "+domain=translation", "evaluator=replay", "drafter=draft_model", "split=validation",
            "search.prompts=8", "max_new_tokens=16", "search.mode=gm_skip",
        ]),
        ("combo sampling", [
            "+domain=mmlu", "temperature=0.5", "drafter=token_recycle", "search.mode=nsga2",
            "search.max_trials=30", "search.seed=7", "compile=true",
        ]),
        ("combo rag cospec", [
            "+domain=rag", "drafter=self", "verification=cospec", "search=algorithm1", "search.eps_metric_abs=0",
            "search.futility_stopping=false", "dtype=float16",
        ]),
    ]
    return out


def identity(overrides: list[str]) -> dict[str, Any]:
    """What the case pins: the study name, the stored protocol, and a digest of the rest of
    the stored metadata (model, drafter settings, relaxed settings...)."""
    from tss_opt.assembly import compose_config, study_identity

    name, meta = study_identity(compose_config(overrides))
    rest = {k: v for k, v in meta.items() if k != "protocol"}
    blob = json.dumps(rest, sort_keys=True, default=str)
    return {"name": name, "protocol": meta["protocol"], "rest": hashlib.sha1(blob.encode()).hexdigest()[:12]}


def settings_cases() -> list[tuple[str, dict[str, Any]]]:
    """Search settings given as a Python-API user gives them (``settings_hash``)."""
    out: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
    out += [(f"mode={m}", {"mode": m, "max_trials": 10}) for m in MODES]
    out += [
        ("random seed=2", {"mode": "random", "max_trials": 10, "seed": 2}),
        ("sleb accept", {"mode": "sleb", "sleb_score": "accept_length"}),
        ("futility on", {"futility_stopping": True}),
        ("futility off", {"futility_stopping": False}),
        ("floor 0.005", {"eps_metric_abs": 0.005}),
        ("floor 0", {"eps_metric_abs": 0.0}),
        ("paired early", {"feasibility": "paired", "early_stopping": True, "early_stop_chunk": 8}),
        ("selection triple_win", {"selection": "triple_win"}),
    ]
    return out


def settings_identity(values: dict[str, Any]) -> str:
    from tss_opt.search.identity import settings_hash

    return settings_hash(values)


if __name__ == "__main__":
    print("EXPECTED = {")
    for label, overrides in cases():
        print(f"    {label!r}: {identity(overrides)!r},")
    print("}")
    print("SETTINGS_EXPECTED = {")
    for label, values in settings_cases():
        print(f"    {label!r}: {settings_identity(values)!r},")
    print("}")
