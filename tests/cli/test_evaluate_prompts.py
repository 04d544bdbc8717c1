"""``evaluate`` honours ``search.prompts`` given on its command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _row(stdout: str) -> list[str]:
    line = next(x for x in stdout.splitlines() if x.startswith("| qa |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_search_prompts_is_honoured_by_evaluate(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "tss_opt.cli.evaluate", "+model=tiny", "+domain=qa", "max_new_tokens=4"]
    r = subprocess.run([*args, "search.prompts=2"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = _row(r.stdout)
    assert row[5] == "2" and row[6] == "4"  # prompts, tokens
