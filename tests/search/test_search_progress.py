"""What a user sees while a search runs: bars on a terminal, one INFO line per trial
and per level, per-chunk lines at DEBUG, and a summary table that says what it measured."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
from project_logs import project_messages
from search_landscape import Landscape

from tss_opt.search import run_search


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _search(tmp_path: Path, stderr: io.StringIO, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    caplog.set_level(logging.DEBUG, logger="tss_opt.search")
    return run_search(
        Landscape(num_layers=6, seed=0), storage=f"sqlite:///{tmp_path / 's.db'}", study_name="progress",
        mode="exhaustive", max_depth=2, feasibility="point",
    )


@pytest.mark.parametrize("terminal", [True, False])
def test_bars_on_a_terminal_and_the_same_lines_either_way(tmp_path, monkeypatch, caplog, terminal):
    stderr = FakeTTY() if terminal else io.StringIO()
    result = _search(tmp_path, stderr, monkeypatch, caplog)
    drawn = stderr.getvalue()
    if terminal:
        # A bar per level: label, trials done of planned, the feasible count, elapsed<left.
        assert "level 1" in drawn and "6/6" in drawn and "feasible" in drawn and "trial" in drawn and "\r" in drawn
    else:
        assert drawn == ""  # no bar garbage in a log
    # Another library's record (Optuna logs one when it creates a study; whether caplog sees
    # it depends on pytest's version) is not the project's and is not counted.
    caplog.handler.emit(logging.makeLogRecord(
        {"name": "optuna.storages._rdb.storage", "levelno": logging.INFO, "levelname": "INFO",
         "msg": "A new study created in RDB with name: progress"}
    ))
    assert any(r.name.startswith("optuna") for r in caplog.records)
    info = project_messages(caplog, logging.INFO)
    trials = [m for m in info if m.startswith("trial #")]
    assert len(trials) == len(result.trials) == 1 + 6 + 15
    # Each trial line carries its level's progress: [done/planned, feasible f, elapsed<left].
    assert all(re.search(r" \[\d+/\d+, feasible \d+, [\d:]+<([\d:]+|\?)\]$", m) for m in trials)
    levels = [lv.level for lv in result.levels]
    assert [m.split(":")[0] for m in info if re.match(r"level \d+: \d+ configurations? planned", m)] == [
        f"level {k}" for k in levels
    ]
    assert len([m for m in info if re.match(r"level \d+ complete", m)]) == len(levels)
    # Nothing else at INFO but the join line and the end line: 1 + trials + 2 per level + 1.
    assert len(info) == 1 + len(trials) + 2 * len(levels) + 1
    debug = [m for m in project_messages(caplog, logging.DEBUG) if m not in info]
    assert any(m.startswith("level 0: evaluated") for m in debug)  # the throttled counts: DEBUG
    assert not [m for m in info if re.match(r"level \d+: evaluated", m)]


# --- the command on a tiny model, with and without a terminal ---------------------------------

CMD = [
    sys.executable, "-m", "tss_opt", "+domain=qa", "+model=tiny", "search.prompts=4", "max_new_tokens=4",
    "search.max_depth=2", "search.early_barrier=0", "search.latter_barrier=0", "search.early_stop_chunk=2",
    "search.validation_candidates=0",
]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("TQDM_DISABLE", None)
    return env


def _run_on_pty(cmd: list[str], cwd: Path) -> tuple[str, str]:
    """``cmd`` with stdout a pipe and stderr a 24 x 120 pseudo-terminal: (stdout, terminal)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=slave, env=_env())
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(timeout=30)
    os.close(master)
    assert proc.returncode == 0, (out.decode()[-3000:], b"".join(chunks).decode(errors="replace")[-3000:])
    return out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_the_command_draws_bars_only_on_a_terminal_and_keeps_chunk_lines_at_debug(tmp_path):
    """A tiny-model search twice: at DEBUG into pipes (a log or CI), and at INFO with stderr on a
    pseudo-terminal. The pipes get no bar; the terminal gets one per level; the INFO run prints
    exactly the DEBUG run's lines that are not DEBUG; per-chunk lines are DEBUG only."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    common = lambda d: [f"storage=sqlite:///{d}/s.db", f"mapping_path={d}/map.yaml"]  # noqa: E731
    piped = subprocess.run(CMD + common(a) + ["log_level=DEBUG"], cwd=a, capture_output=True, text=True,
                           timeout=300, env=_env())
    assert piped.returncode == 0, piped.stdout[-3000:] + piped.stderr[-3000:]
    assert "\r" not in piped.stdout + piped.stderr and piped.stderr == ""  # no bar in a log
    lines = piped.stdout.splitlines()
    debug = [x for x in lines if "][DEBUG] - " in x]
    kept = [x for x in lines if "][DEBUG] - " not in x]
    chunks = [x for x in debug if re.search(r"skip=.* prompts \d+-\d+/\d+ replayed", x)]
    trials = [x for x in kept if "][INFO] - trial #" in x]
    n = int(re.search(r"^(\d+) configurations; this worker", piped.stdout, re.M).group(1))
    assert len(trials) == n and n >= 5  # one INFO line per trial
    assert chunks and not [x for x in kept if re.search(r"prompts? \d+(-\d+)?/\d+", x)]  # per-chunk: DEBUG only
    assert not [x for x in kept if "stopped early after" in x]  # why a trial stopped: DEBUG
    # The table says what measured it: replay timed no decoding, so no tok/s column.
    assert "| configuration | skip set | accepted length | token_f1 | cost (analytic) |" in piped.stdout
    assert "tok/s" not in piped.stdout.split("| configuration |")[1].split("\n")[0]
    assert "figures: evaluator=replay" in piped.stdout

    out, terminal = _run_on_pty(CMD + common(b), b)
    assert "\r" in terminal and "level 1" in terminal and "trial" in terminal  # bars, on stderr only
    assert "\r" not in out
    # The same lines as the DEBUG run without its DEBUG lines (timestamps aside; a level's trials
    # finish in any order).
    head = lambda x: re.sub(r"\d", "#", re.sub(r"^\[[^]]*\]", "", x))[:48]  # noqa: E731
    shown = out.splitlines()
    assert len(shown) == len(kept), "\n".join(shown)
    assert sorted(map(head, shown)) == sorted(map(head, kept))
