"""``python -m tss_opt.cli.serve backend=vllm``: vLLM's OpenAI server with the TSS plugin, called
by the official openai client over a socket: the domain field, ``vllm_xargs``, the ``tss``
object (a stream's last chunk too), the 400s, the API key, the per-layer counts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from runtime_support import mapping_data
from server_support import free_port, stop_command
from vllm_support import REPO, TINY_VLLM

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

KEY = "test-key-123"
WIDE = [f"model.tiny.{k}={v}" for k, v in TINY_VLLM["tiny"].items()]
MESSAGES = [{"role": "user", "content": "Who wrote Hamlet?"}]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TSS_API_KEY", "VLLM_API_KEY")}
    env.update(PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1", TSS_API_KEY=KEY)
    return env


def _serve(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.serve", "backend=vllm", "+model=tiny", *WIDE, *args],
        capture_output=True, text=True, timeout=600, env=_env(), cwd=cwd, **kw,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_serve")
    mapping = tmp / "mapping.yaml"
    mapping.write_text(yaml.safe_dump(mapping_data({"qa": [1], "summarization": [1, 2]}, scopes={"qa": "all"})))
    port = free_port()
    log = tmp / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tss_opt.cli.serve", "backend=vllm", "+model=tiny", *WIDE, f"mapping_path={mapping}",
             f"port={port}", "+domain=summarization", "domain.system_prompt=Summarize in one line.", "--",
             "--max-model-len", "1024", "--block-size", "32"],
            stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=tmp,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {log.read_text()[-5000:]}")
        if "Application startup complete" in log.read_text():
            break
        time.sleep(1)
    else:
        proc.kill()
        raise AssertionError(f"the server did not start: {log.read_text()[-5000:]}")
    yield url, proc, log
    status = stop_command(proc, signal.SIGTERM)
    assert status is not None, "the server did not stop on SIGTERM"


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def _chat(url: str, **extra):
    return _client(url).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, extra_body=extra or None
    )


def test_the_command_line_reaches_vllm(server):
    url, _, log = server
    text = log.read_text()
    assert "TSS plugin" in text and "qa -> [1]" in text  # our start line, then vLLM's own
    assert re.search(r"Resolved architecture: TssLlamaForCausalLM", text)
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"] == "tiny"


def test_the_domain_field_and_vllm_xargs_name_the_same_skip_set(server):
    url = server[0]
    by_field = _chat(url, domain="qa")
    by_xargs = _chat(url, vllm_xargs={"tss_domain": "qa"})
    explicit = _chat(url, vllm_xargs={"tss_skip": [1], "tss_scope": "all"})
    dense = _chat(url)
    assert by_field.tss == by_xargs.tss == {
        "domain": "qa", "skip_set": [1], "scope": "all", "source": "domain", "mapped": True, "routed": False,
    }
    assert explicit.tss["skip_set"] == [1] and explicit.tss["source"] == "explicit"
    assert by_field.choices[0].message.content == by_xargs.choices[0].message.content == explicit.choices[0].message.content
    assert by_field.choices[0].message.content != dense.choices[0].message.content
    assert dense.tss == {"domain": None, "skip_set": [], "scope": "verify", "source": "none", "mapped": False, "routed": False}
    unknown = _chat(url, domain="poetry")  # not in the mapping: dense, and said so
    assert unknown.tss["skip_set"] == [] and unknown.tss["mapped"] is False
    assert unknown.choices[0].message.content == dense.choices[0].message.content


def test_a_domains_system_prompt_goes_first(server):
    url = server[0]
    with_prompt = _chat(url, domain="summarization")  # the command's +domain gave it a system prompt
    plain = _chat(url, vllm_xargs={"tss_skip": [1, 2]})
    assert with_prompt.usage.prompt_tokens > plain.usage.prompt_tokens


def test_completions_and_a_stream_carry_the_tss_object(server):
    url = server[0]
    cl = _client(url)
    r = cl.completions.create(model="tiny", prompt="hello there", max_tokens=8, temperature=0, extra_body={"domain": "qa"})
    assert r.tss["skip_set"] == [1]
    chunks = list(cl.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stream=True, extra_body={"domain": "qa"},
    ))
    assert chunks[-1].tss["skip_set"] == [1] and chunks[-1].choices == []
    assert all(getattr(c, "tss", None) is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _chat(url, domain="qa").choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"vllm_xargs": {"tss_skip": [9]}}, "vllm_xargs.tss_skip"),
        ({"vllm_xargs": {"tss_skip": "1"}}, "vllm_xargs.tss_skip"),
        ({"vllm_xargs": {"tss_scope": "most"}}, "vllm_xargs.tss_scope"),
        ({"vllm_xargs": {"tss_skp": [1]}}, "vllm_xargs.tss_skp"),
        ({"domain": 7}, "domain"),
        ({"domain": "qa", "vllm_xargs": {"tss_domain": "rag"}}, "domain"),
    ],
)
def test_malformed_fields_are_400s_naming_the_field(server, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(server[0], **extra)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert _chat(server[0]).choices[0].message.content  # the engine goes on


def test_without_the_key_vllm_answers_401_before_the_fields_are_read(server):
    with pytest.raises(openai.AuthenticationError):
        _client(server[0], key="wrong").chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4, extra_body={"vllm_xargs": {"tss_skip": [9]}}
        )


def test_layer_counts(server):
    url = server[0]
    _chat(url, domain="qa")
    counts = httpx.get(url + "/tss/layer_counts", headers={"Authorization": f"Bearer {KEY}"}).json()["workers"][0]
    assert counts["skipped"][1] > 0 and len(counts["dense"]) == 4
    assert httpx.get(url + "/tss/layer_counts").status_code == 401


def test_refused_at_start_with_one_line(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(mapping_data({"qa": [1]}, model="another-model")))
    proc = _serve([f"mapping_path={other}"], tmp_path)
    assert proc.returncode == 2 and "is for model 'another-model'" in proc.stderr, proc.stderr[-3000:]
    proc = _serve([f"mapping_path={other}", "prompt=hi"], tmp_path)
    assert proc.returncode == 2 and "drop one of them" in proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(mapping_data({"qa": [1]})))
    proc = _serve([f"mapping_path={good}", "--", "--hf-overrides", "{}"], tmp_path)
    assert proc.returncode == 2 and "set by backend=vllm itself" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "tss_opt.cli.serve", "+model=tiny", f"mapping_path={good}", "--", "--max-num-seqs", "4"],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path,
    )
    assert proc.returncode == 2 and "add backend=vllm" in proc.stderr
