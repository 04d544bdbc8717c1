"""``python -m tss_opt.cli.serve`` without ``prompt=``: the whole command as a subprocess,
the router fitted at start (not on the first request)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import yaml
from runtime_support import mapping_data
from server_support import start_command, stop_command, subprocess_env


def test_the_command_loads_everything_at_start_and_serves_labelled_and_unlabeled_requests(tmp_path: Path):
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(yaml.safe_dump(mapping_data({"qa": [1], "translation": [2, 3]})), encoding="utf-8")
    log = tmp_path / "serve.log"
    proc, url = start_command([f"mapping_path={mapping}", "max_new_tokens=6"], subprocess_env(), log)
    try:
        started = log.read_text()
        # The router was fitted before the server listened, and cached next to the mapping.
        assert "router: fitting" in started and started.index("router: saved") < started.index("Uvicorn running")
        # The server's default drafter is prompt lookup sized to this machine.
        assert "serving with drafter pld (num_tokens=auto" in started
        assert (tmp_path / "router.tiny_llama_4l_seed0.json").is_file()
        health = httpx.get(url + "/health").json()
        assert health == {"status": "ok", "model": "tiny", "domains": ["qa", "translation"], "router": True, "queue_depth": 0,
                          "batch_size": 0, "max_batch": 16, "busy": False}
        cl = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        r = cl.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Who wrote Hamlet?"}], extra_body={"domain": "qa"})
        assert r.tss["skip_set"] == [1] and r.usage.completion_tokens <= 6
        r = cl.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Translate German to English: Guten Morgen."}])
        assert set(r.tss) == {"domain", "skip_set", "routed", "accept_length", "tokens_per_s", "steps", "layer_forwards"}
        assert r.tss["routed"] == (r.tss["domain"] is not None)
    finally:
        status = stop_command(proc, signal.SIGTERM)
    assert status == 0  # SIGTERM drains and exits 0 (uvicorn re-raised it: -15)
    text = log.read_text()
    assert text.count("router: fitting") == 1  # not again on a request
    assert "Who wrote Hamlet" not in text and "Guten Morgen" not in text  # no prompts in the log


def test_a_missing_mapping_stops_the_server_command_with_one_line(tmp_path: Path):
    missing = tmp_path / "missing.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.serve", "+model=tiny", f"mapping_path={missing}"],
        capture_output=True, text=True, timeout=300, env=subprocess_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: Mapping file {missing} does not exist" + proc.stderr.split("does not exist", 1)[1].strip()]
    assert "loaded tiny" not in proc.stdout
