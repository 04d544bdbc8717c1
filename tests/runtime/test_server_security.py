"""Security against the real server: the API key, the body limit, the refusal to bind beyond
loopback without a key (the command run as a subprocess), and no key or prompt in logs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from runtime_support import mapping_data
from server_support import (
    make_state,
    running_server,
    start_command,
    stop_command,
    subprocess_env,
    tiny_controller,
)

from tss_opt.errors import UsageError
from tss_opt.runtime.server import ServerSettings

KEY = "sk-test-Zq8v3LrT0pSecretValue"
PROMPT = "my private prompt about zebras"


@pytest.fixture(scope="module")
def mapping_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sec") / "mapping.yaml"
    path.write_text(yaml.safe_dump(mapping_data({"qa": [1]})), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def keyed(tiny, tiny_target, mapping_file):
    state = make_state(tiny_controller(tiny, tiny_target, mapping_file), None, api_key=KEY)
    with running_server(state, log_level="debug") as url:
        yield state, url


def _tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("tss_generated_tokens_total"))


def test_no_key_or_a_wrong_key_is_401_and_nothing_is_generated(keyed, caplog):
    caplog.set_level(logging.DEBUG)
    state, url = keyed
    served, tokens = state.worker.served, _tokens(url)
    bodies = []
    # no key at all (raw HTTP: the openai client always sends one)
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    bodies.append(r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_api_key"
    for path in ("/v1/models", "/v1/chat/completions"):
        r = httpx.request("GET" if path.endswith("models") else "POST", url + path, json={})
        assert r.status_code == 401
        bodies.append(r.text)
    # a wrong key, through the official client
    wrong = openai.OpenAI(base_url=url + "/v1", api_key=KEY + "x", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model="tiny", prompt=PROMPT, max_tokens=4)
    assert e.value.status_code == 401
    bodies.append(json.dumps(e.value.body))
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=4, stream=True)
    assert state.worker.served == served and _tokens(url) == tokens  # nothing generated
    # the right key
    right = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    r = right.completions.create(model="tiny", prompt=PROMPT, max_tokens=4)
    assert r.usage.completion_tokens >= 1 and state.worker.served == served + 1
    bodies.append(r.model_dump_json())
    streamed = list(right.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=4, stream=True))
    assert streamed[-1].tss is not None
    # The key is in no response and no log line (uvicorn's at debug level included); the prompt
    # is in no log line at the default level either.
    assert all(KEY not in b for b in bodies)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(KEY not in line for line in lines)
    assert all(PROMPT not in r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    assert KEY not in repr(state.settings) and KEY not in str(state.settings)


def test_health_is_open_and_metrics_follow_metrics_auth(keyed, tiny, tiny_target, mapping_file):
    _, url = keyed
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert httpx.get(url + "/metrics").status_code == 401
    assert httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    state = make_state(tiny_controller(tiny, tiny_target, mapping_file), None, api_key=KEY, metrics_auth=False)
    with running_server(state) as url2:
        assert httpx.get(url2 + "/metrics").status_code == 200
        assert httpx.get(url2 + "/v1/models").status_code == 401


def test_a_10mb_body_is_413_and_the_server_stays_healthy(keyed):
    state, url = keyed
    served = state.worker.served
    big = json.dumps({"model": "tiny", "prompt": "x" * (10 * 1024 * 1024)}).encode()
    auth = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    r = httpx.post(url + "/v1/completions", content=big, headers=auth, timeout=60)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and "max_body_bytes" in err["message"]

    # A body without Content-Length (chunked) is counted while it arrives.
    def chunks():
        for _ in range(10):
            yield b"x" * (1024 * 1024)

    r = httpx.post(url + "/v1/completions", content=chunks(), headers=auth, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert httpx.get(url + "/health").json()["status"] == "ok"
    ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0).completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert ok.choices and state.worker.served == served + 1


def test_settings_refuse_an_open_non_loopback_bind():
    assert ServerSettings(host="127.0.0.1").check() is None
    assert ServerSettings(host="::1").check() is None
    assert ServerSettings(host="localhost").check() is None
    for host in ("0.0.0.0", "192.168.1.20", "::", "example.org"):
        with pytest.raises(UsageError, match="allow_open=true"):
            ServerSettings(host=host).check()
        ServerSettings(host=host, api_key="k").check()
        ServerSettings(host=host, allow_open=True).check()


def test_the_key_comes_from_tss_api_key_and_two_different_keys_are_refused():
    from omegaconf import OmegaConf

    from tss_opt.config.serve import serve_settings

    cfg = OmegaConf.create({"host": "0.0.0.0", "api_key": None})
    assert ServerSettings.from_serve(serve_settings(cfg), environ={"TSS_API_KEY": "abc"}).api_key == "abc"
    cfg2 = OmegaConf.create({"api_key": "key-from-argv-123"})
    with pytest.raises(UsageError, match="differ") as e:
        ServerSettings.from_serve(serve_settings(cfg2), environ={"TSS_API_KEY": "key-from-env-456"})
    assert "key-from" not in str(e.value)


# ------------------------------------------------------------------ the command (subprocess)
@pytest.fixture
def empty_mapping(tmp_path: Path) -> Path:
    path = tmp_path / "mapping.yaml"
    path.write_text("format: 1\ndomains: {}\n", encoding="utf-8")
    return path


def test_binding_beyond_loopback_without_a_key_refuses_to_start(empty_mapping):
    proc = subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.serve", "+model=tiny", "host=0.0.0.0", f"mapping_path={empty_mapping}"],
        capture_output=True, text=True, timeout=120, env=subprocess_env(),
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "api_key" in lines[0] and "TSS_API_KEY" in lines[0] and "allow_open=true" in lines[0]
    assert "loaded tiny" not in proc.stdout + proc.stderr  # refused before loading the model


def test_allow_open_starts_on_all_interfaces_and_warns_once(empty_mapping, tmp_path):
    log = tmp_path / "serve.log"
    proc, url = start_command(["host=0.0.0.0", "allow_open=true", f"mapping_path={empty_mapping}"], subprocess_env(), log)
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200
        # The mapping is empty, yet the router was fitted at start: a search may fill it.
        assert httpx.get(url + "/health").json()["router"] is True
    finally:
        stop_command(proc)
    text = log.read_text()
    assert text.count("without an API key (allow_open=true)") == 1


def test_the_command_reads_tss_api_key_and_never_prints_it(empty_mapping, tmp_path):
    log = tmp_path / "serve.log"
    proc, url = start_command(["host=0.0.0.0", f"mapping_path={empty_mapping}", "log_level=DEBUG"], subprocess_env(TSS_API_KEY=KEY), log)
    try:
        assert httpx.get(url + "/v1/models").status_code == 401
        bad = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and KEY not in bad.text
        cl = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        assert cl.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).choices
    finally:
        stop_command(proc)
    text = log.read_text()
    assert "API key: required" in text and KEY not in text and "without an API key" not in text


def test_a_port_in_use_is_one_clear_error():
    import socket

    from tss_opt.runtime.server.run import check_bind

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UsageError, match=f"cannot listen on 127.0.0.1:{port}.*port="):
            check_bind("127.0.0.1", port)
    check_bind("127.0.0.1", 0)
