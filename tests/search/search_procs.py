"""Starting and collecting worker processes for the multi-process tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def spawn_workers(
    n: int, storage: str, study: str, workdir: Path, *extra: str
) -> list[subprocess.Popen]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    procs = []
    for i in range(n):
        cmd = [
            sys.executable,
            str(HERE / "search_worker.py"),
            "--storage", storage,
            "--study", study,
            "--log", str(workdir / f"worker{i}.log"),
            "--out", str(workdir / f"worker{i}.json"),
            *extra,
        ]  # fmt: skip
        err = open(workdir / f"worker{i}.stderr", "w")
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=err, stderr=err))
    return procs


def wait_all(procs: list[subprocess.Popen], workdir: Path, timeout: float = 240) -> list[int]:
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes


def stderr_of(workdir: Path) -> str:
    return "\n".join(
        f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(workdir.glob("worker*.stderr"))
    )


def outputs(workdir: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(workdir.glob("worker*.json"))]


def evaluations(workdir: Path) -> tuple[Counter, Counter]:
    """Counts of started and of finished evaluations per skip set, over all worker logs."""
    from search_landscape import read_log

    started: Counter = Counter()
    done: Counter = Counter()
    for f in sorted(workdir.glob("worker*.log")):
        for what, skip in read_log(f):
            (started if what == "start" else done)[skip] += 1
    return started, done


def run_one(
    storage: str, study: str, workdir: Path, name: str, *extra: str, timeout: float = 180
) -> tuple[int, str]:
    """Run one worker to its end; its exit code and stderr (files ``<name>.*`` in workdir)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, str(HERE / "search_worker.py"), "--storage", storage, "--study", study,
        "--log", str(workdir / f"{name}.log"), "--out", str(workdir / f"{name}.json"), *extra,
    ]  # fmt: skip
    err = workdir / f"{name}.stderr"
    with open(err, "w") as f:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=f, timeout=timeout).returncode
    return code, err.read_text()
