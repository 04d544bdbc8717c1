"""Helpers of the training tests (constants, the toy domain, small settings). They live here,
not in conftest.py: several conftest.py files exist, so importing "conftest" by name could pick
another folder's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tss_opt.config.train import TrainSettings

EOS = 258
# Short, repetitive sentences: the tiny random model's continuations of them loop, so a head
# can learn them in a few dozen steps and the accepted length rises deterministically.
TOY = [f"the {a} sat on the {b}. the {a} sat on the {b}." for a in ("cat", "dog", "fox", "owl") for b in ("mat", "log", "hat")]
EXTRA = [f"a {a} and a {b} and a {a} and a {b}." for a in ("bee", "ant", "elk") for b in ("cow", "pig")]


def write_toy_domain(folder: Path, extra: list[str] | None = None) -> dict:
    """A 12-record domain (6 calibration, 2 validation, 4 held out) and its train_data file."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "toy.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "prompt": p, "references": ["x"]}) + "\n" for i, p in enumerate(TOY)))
    cfg = {
        "name": "toy", "data": str(data), "metric": "token_f1", "max_new_tokens": 16,
        "pool_size": 12, "calibration_size": 6, "validation_size": 2, "heldout_size": 4,
    }
    if extra is not None:
        train = folder / "toy_train.jsonl"
        train.write_text("".join(json.dumps({"id": f"e{i}", "prompt": p}) + "\n" for i, p in enumerate(extra)))
        cfg["train_data"] = str(train)
    return cfg


def settings(**kw: object) -> TrainSettings:
    """Small, deterministic training settings for the tiny model."""
    base = TrainSettings(
        max_minutes=None, max_steps=60, lr=3e-3, warmup_steps=5, batch_size=4, seq_len=64,
        continuation_tokens=48, probe_every=0, checkpoint_every=0,
        probe_prompts=3, probe_tokens=32, progress=False,
    )
    return replace(base, **kw)
