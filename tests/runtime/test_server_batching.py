"""Many requests at once: the real server, the official openai client over a
socket, requests of three domains decoding in one continuous batch, each on its own skip set."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from runtime_support import mapping_data
from server_support import make_state, running_server, tiny_controller

SKIPS = {"qa": [1], "translation": [2, 3], "summarization": [0]}
DOMAINS = ["qa", "translation", "summarization"]
LONG = 1500  # tokens of a request that outlives the others (EOS is turned off)


@pytest.fixture(scope="module")
def mapping_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batching") / "mapping.yaml"
    path.write_text(yaml.safe_dump(mapping_data(SKIPS)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server(tiny, tiny_target, mapping_file):
    c = tiny_controller(tiny, tiny_target, mapping_file)
    c.eos_token_ids = ()  # every request runs to its max_tokens: lengths are what the test says
    state = make_state(c, None, max_queue=16, max_batch=8, max_tokens_cap=1900)
    with running_server(state) as url:
        yield state, url


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0, timeout=120)


def _ask(client: openai.OpenAI, i: int, max_tokens: int = 16, stream: bool = False):
    domain = DOMAINS[i % 3]
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"request {i}: tell me about item {i * 7}"}],
        max_tokens=max_tokens, temperature=0, extra_body={"domain": domain}, stream=stream,
    )


def _together(fn, n: int) -> dict[int, object]:
    out: dict[int, object] = {}

    def run(i: int) -> None:
        out[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


def test_eight_concurrent_requests_of_three_domains_each_equal_its_solo_output(server, client):
    state, _ = server
    solo = {i: _ask(client, i) for i in range(8)}  # one at a time: each alone in the batch
    state.worker.peak_batch = 0
    together = _together(lambda i: _ask(client, i), 8)
    assert state.worker.peak_batch >= 4  # they really shared steps
    L = state.controller.target.num_layers
    for i in range(8):
        got, want = together[i], solo[i]
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.tss["domain"] == DOMAINS[i % 3] and got.tss["skip_set"] == SKIPS[DOMAINS[i % 3]]
        # The skip set's saving, per row: every verification step ran L - |S| layers on it.
        assert got.tss["layer_forwards"] == got.tss["steps"] * (L - len(SKIPS[DOMAINS[i % 3]]))


def test_a_request_arriving_while_another_decodes_joins_without_waiting(server, client):
    state, url = server
    finished = threading.Event()
    chunks: list[str] = []

    def long_stream() -> None:
        for ch in _ask(client, 100, max_tokens=LONG, stream=True):
            if ch.choices and ch.choices[0].delta.content:
                chunks.append(ch.choices[0].delta.content)
        finished.set()

    t = threading.Thread(target=long_stream)
    t.start()
    deadline = time.monotonic() + 60
    while not chunks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert chunks, "the long request never started streaming"
    short = _ask(client, 1, max_tokens=4)
    # The short request was answered while the long one was still decoding in the batch.
    assert short.usage.completion_tokens == 4
    assert not finished.is_set() and state.worker.batch_size >= 1
    t.join(300)
    assert finished.is_set()


def test_a_cancelled_row_leaves_while_the_others_finish_unchanged(server, client, caplog):
    caplog.set_level(logging.INFO, logger="tss_opt.runtime")
    state, url = server
    want = _ask(client, 5, max_tokens=40).choices[0].message.content
    other: dict[str, str] = {}
    started = threading.Event()

    def medium() -> None:
        started.wait(60)
        other["text"] = _ask(client, 5, max_tokens=40).choices[0].message.content

    t = threading.Thread(target=medium)
    t.start()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go on and on"}], "max_tokens": LONG,
            "stream": True, "domain": "qa"}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        started.set()
        time.sleep(0.2)  # the medium request joins the batch
    t.join(120)
    assert other["text"] == want
    deadline = time.monotonic() + 10
    while state.worker.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    msgs = [r.getMessage() for r in caplog.records if "cancelled by its client" in r.getMessage()]
    assert len(msgs) == 1 and int(msgs[0].split("after ")[1].split()[0]) < LONG


def test_stream_deltas_join_to_the_non_streamed_text_under_concurrency(server, client):
    plain = _together(lambda i: _ask(client, i, max_tokens=24), 4)

    def streamed(i: int) -> str:
        return "".join(ch.choices[0].delta.content or "" for ch in _ask(client, i, max_tokens=24, stream=True) if ch.choices)

    joined = _together(streamed, 4)
    for i in range(4):
        assert joined[i] == plain[i].choices[0].message.content


def test_metrics_and_health_show_the_batch(server, client):
    state, url = server
    seen: list[str] = []
    t = threading.Thread(target=lambda: _together(lambda i: _ask(client, i, max_tokens=200), 3))
    t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = httpx.get(url + "/metrics").text
        if "tss_batch_rows{" in m and "tss_batch_size 3.0" in m:
            seen.append(m)
            break
        time.sleep(0.005)
    t.join(120)
    assert seen, "never saw three rows in the batch"
    assert 'tss_batch_rows{skip_set="1"} 1.0' in seen[0] and 'tss_batch_rows{skip_set="2,3"} 1.0' in seen[0]
    health = httpx.get(url + "/health").json()
    assert health["max_batch"] == 8 and health["batch_size"] == 0


def test_a_failed_step_answers_its_requests_500_and_the_server_goes_on(server, client, monkeypatch):
    from tss_opt.decoding import batch as batch_mod

    real = batch_mod.BatchEngine.step
    calls = {"n": 0}

    def failing_once(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault in a batched step")
        return real(self)

    monkeypatch.setattr(batch_mod.BatchEngine, "step", failing_once)
    with pytest.raises(openai.InternalServerError):
        _ask(client, 3, max_tokens=4)
    ok = _ask(client, 3, max_tokens=4)
    assert ok.usage.completion_tokens == 4
