"""A user domain added without code (one YAML in a --config-dir, one JSONL with a singular
``reference`` field and GSM8K-style ``#### 42`` answers, metric ``numeric_match``) through
every command: evaluate, search, export, serve, launch, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SETTINGS = [
    "+model=tiny", "max_new_tokens=4",
    "search.early_barrier=0", "search.latter_barrier=0", "search.max_depth=1",
]


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    # This checkout's code, whatever the working directory (workers inherit it).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return r.stdout + r.stderr


@pytest.fixture
def user_conf(tmp_path: Path) -> Path:
    data = tmp_path / "data" / "arith.jsonl"
    data.parent.mkdir()
    rows = [
        {"id": f"a{i}", "question": f"Tom has {i} apples and buys {i + 2} more. How many apples?",
         "reference": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}"}
        for i in range(6)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    conf = tmp_path / "my_conf"
    (conf / "domain").mkdir(parents=True)
    (conf / "domain" / "mydomain.yaml").write_text(
        "name: mydomain\n"
        f"data: {data}\n"
        'prompt_template: "{question}"\n'
        "system_prompt: Answer with the number after ####.\n"
        "metric: numeric_match\n"
        "reference_field: reference\n"
        "reference_pattern: '####\\s*(.+)'\n"
        "max_new_tokens: 4\npool_size: 6\ncalibration_size: 2\nvalidation_size: 0\nheldout_size: 4\n"
    )
    return conf


@pytest.mark.slow
def test_user_domain_in_every_command(user_conf: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    db = f"storage=sqlite:///{tmp_path}/s.db"
    mapping = tmp_path / "map.yaml"
    cd = ["--config-dir", str(user_conf)]

    out = _ok(_run(["-m", "tss_opt.cli.evaluate", *cd, "+domain=mydomain", "+model=tiny", "max_new_tokens=4", "skip=[1]"], work))
    assert "| mydomain | tiny |" in out and "numeric_match" in out

    out = _ok(_run(["-m", "tss_opt", *cd, "+domain=mydomain", *SETTINGS, db, f"mapping_path={mapping}"], work))
    assert "level 1 complete: evaluated 4/4" in out
    searched = yaml.safe_load(mapping.read_text())
    assert "mydomain" in json.dumps(searched)

    exported = tmp_path / "exported.yaml"
    out = _ok(_run(["-m", "tss_opt.cli.export", *cd, "+domain=mydomain", *SETTINGS, db, f"mapping_path={exported}"], work))
    assert f"{exported}: mydomain -> skip" in out
    assert "mydomain" in json.dumps(yaml.safe_load(exported.read_text()))

    # Labelled: the mapped skip set, not "not in the mapping".
    out = _ok(_run(["-m", "tss_opt.cli.serve", *cd, "+model=tiny", "max_new_tokens=4", f"mapping_path={mapping}",
                    "prompt='Tom has 3 apples and buys 5 more. How many apples?'", "request_domain=mydomain"], work))
    assert "domain: mydomain [from request_domain]" in out and "not in the mapping" not in out
    # Unlabeled: the router is fitted on the user domain too (it was refused or dropped before).
    out = _ok(_run(["-m", "tss_opt.cli.serve", *cd, "+model=tiny", "max_new_tokens=4", f"mapping_path={mapping}",
                    "prompt='Tom has 3 apples and buys 5 more. How many apples?'"], work))
    assert "router: fitting on the calibration prompts of" in out and "mydomain" in out.split("router: fitting", 1)[1].splitlines()[0]

    # launch passes --config-dir on to its workers (a fresh study: the workers search it).
    db2 = f"storage=sqlite:///{tmp_path}/l.db"
    out = _ok(_run(["-m", "tss_opt.cli.launch", *cd, "+domain=mydomain", *SETTINGS, db2,
                    f"mapping_path={tmp_path}/launch.yaml", "devices=[cpu]"], work))
    assert "1 workers finished" in out and f"--config-dir {user_conf.resolve()}" in out
    assert "mydomain" in (tmp_path / "launch.yaml").read_text()

    # report finds the mapped user domain through --config-dir (no +domain= needed).
    out = _ok(_run(["-m", "tss_opt.cli.report", *cd, "+model=tiny", "max_new_tokens=4", "heldout_prompts=2",
                    f"mapping_path={mapping}", db, f"report_dir={tmp_path}/report"], work))
    assert "mydomain" in out and (tmp_path / "report" / "heldout.md").is_file()
