"""The OpenAI-compatible server, started for real (uvicorn on a socket) over the tiny model
and spoken to with the official ``openai`` client and raw HTTP (httpx)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from runtime_support import mapping_data
from server_support import (
    answer_text,
    make_state,
    plain_greedy,
    running_server,
    tiny_controller,
    tiny_router,
)

from tss_opt.evaluation.domains import Example, format_prompt
from tss_opt.runtime.chat import chat_ids

SKIPS = {"qa": [1], "translation": [2, 3]}
HAMLET = [{"role": "user", "content": "Who wrote Hamlet?"}]


@pytest.fixture(scope="module")
def mapping_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "mapping.yaml"
    path.write_text(yaml.safe_dump(mapping_data(SKIPS)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server(tiny, tiny_target, mapping_file):
    """One server for the module's read-only tests: a router, a system prompt for qa."""
    c = tiny_controller(tiny, tiny_target, mapping_file, tiny_router(tiny, tiny_target), system_prompts={"qa": "Answer briefly."})
    state = make_state(c, None, max_queue=16, max_tokens_cap=64)
    with running_server(state) as url:
        yield state, url


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0, timeout=60)


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + ("{" if labels else "")) or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            got = head[len(name):].strip("{}")
            if all(part in got.split(",") for part in want.split(",") if part):
                total += float(value)
    return total


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_completion_continues_the_raw_prompt_exactly_as_greedy_decoding(server, client):
    state, _ = server
    c = state.controller
    r = client.completions.create(model="tiny", prompt="hello there", max_tokens=10, extra_body={"domain": "qa"})
    ids = c.tokenizer("hello there", return_tensors="pt")["input_ids"][0]
    want = plain_greedy(c, ids, frozenset({1}), 10)
    assert r.choices[0].text == answer_text(c.tokenizer, want)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want)
    assert r.usage.total_tokens == len(ids) + len(want)
    assert r.tss["domain"] == "qa" and r.tss["skip_set"] == [1] and r.tss["routed"] is False
    assert r.tss["accept_length"] >= 1.0 and r.tss["tokens_per_s"] > 0
    assert r.choices[0].finish_reason in ("length", "stop")


def test_chat_applies_the_template_and_the_domain_system_prompt_as_the_search_did(server, client):
    state, _ = server
    c = state.controller
    r = client.chat.completions.create(model="tiny", messages=HAMLET, max_tokens=12, extra_body={"domain": "qa"})
    # Exactly the search's prompt for this domain: format_prompt with its system prompt.
    ids = format_prompt(c.tokenizer, Example(id="x", prompt="Who wrote Hamlet?", references=()), "Answer briefly.")
    want = plain_greedy(c, ids, frozenset({1}), 12)
    assert r.choices[0].message.content == answer_text(c.tokenizer, want)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids)
    # Another domain has no system prompt: the plain template.
    r2 = client.chat.completions.create(model="tiny", messages=HAMLET, max_tokens=12, extra_body={"domain": "translation"})
    ids2 = chat_ids(c.tokenizer, HAMLET)
    assert r2.usage.prompt_tokens == len(ids2)
    assert r2.choices[0].message.content == answer_text(c.tokenizer, plain_greedy(c, ids2, frozenset({2, 3}), 12))
    assert r2.tss["skip_set"] == [2, 3]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streamed_chunks_join_to_the_non_streamed_text(client, kind):
    kw = {"model": "tiny", "max_tokens": 40, "extra_body": {"domain": "translation"}}
    if kind == "chat":
        full = client.chat.completions.create(messages=HAMLET, **kw)
        chunks = list(client.chat.completions.create(messages=HAMLET, stream=True, **kw))
        joined = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        text = full.choices[0].message.content
    else:
        full = client.completions.create(prompt="Once upon a time", **kw)
        chunks = list(client.completions.create(prompt="Once upon a time", stream=True, **kw))
        joined = "".join(ch.choices[0].text for ch in chunks)
        text = full.choices[0].text
    assert joined == text and len(text) > 0
    assert len(chunks) > 2  # really streamed, not one chunk
    last = chunks[-1]
    assert last.choices[0].finish_reason == full.choices[0].finish_reason
    assert last.tss == full.tss | {"tokens_per_s": last.tss["tokens_per_s"]}
    assert last.usage.completion_tokens == full.usage.completion_tokens
    assert all(getattr(ch, "tss", None) is None for ch in chunks[:-1])


def test_stream_is_server_sent_events_ending_with_done(server):
    _, url = server
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][6:])
    assert last["object"] == "text_completion" and "tss" in last and last["choices"][0]["finish_reason"]


def test_without_domain_the_router_decides(server, client):
    state, _ = server
    c = state.controller
    msgs = [{"role": "user", "content": "Translate German to English: Die Katze schlaeft."}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6)
    routed, decision = c.resolve(chat_ids(c.tokenizer, msgs), None)
    assert decision is not None and routed in SKIPS
    assert r.tss["routed"] is True and r.tss["domain"] == routed
    assert r.tss["skip_set"] == SKIPS[routed]


def test_an_unmapped_domain_runs_dense(client):
    r = client.chat.completions.create(model="tiny", messages=HAMLET, max_tokens=4, extra_body={"domain": "poetry"})
    assert r.tss["domain"] == "poetry" and r.tss["skip_set"] == [] and r.tss["routed"] is False


def test_stop_seed_and_temperature(server, client):
    state, _ = server
    full = client.completions.create(model="tiny", prompt="xyz", max_tokens=30).choices[0].text
    stop = full[5:7]
    assert stop and full.find(stop) >= 0
    cut = client.completions.create(model="tiny", prompt="xyz", max_tokens=30, stop=[stop])
    assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(model="tiny", prompt="xyz", max_tokens=30, stop=stop, stream=True))
    assert streamed == cut.choices[0].text
    a = client.completions.create(model="tiny", prompt="xyz", max_tokens=20, temperature=1.0, seed=7).choices[0].text
    b = client.completions.create(model="tiny", prompt="xyz", max_tokens=20, temperature=1.0, seed=7).choices[0].text
    assert a == b  # seeded sampling is reproducible


def test_metrics_count_requests_and_tokens_by_domain(server, client):
    _, url = server
    before = httpx.get(url + "/metrics").text
    r = client.chat.completions.create(model="tiny", messages=HAMLET, max_tokens=7, extra_body={"domain": "qa"})
    after = httpx.get(url + "/metrics").text
    assert _metric(after, "tss_requests_total", domain="qa", endpoint="chat_completions") == _metric(
        before, "tss_requests_total", domain="qa", endpoint="chat_completions") + 1
    assert _metric(after, "tss_generated_tokens_total", domain="qa") == _metric(
        before, "tss_generated_tokens_total", domain="qa") + r.usage.completion_tokens
    assert _metric(after, "tss_accept_length_count", domain="qa") == _metric(before, "tss_accept_length_count", domain="qa") + 1
    assert _metric(after, "tss_request_latency_seconds_count", endpoint="chat_completions") >= 1
    assert "tss_queue_depth 0.0" in after


BAD = [
    # (endpoint, raw body, status, param, code)
    ("completions", b"{not json", 400, None, "invalid_json"),
    ("completions", b"[1, 2]", 400, None, "invalid_json"),
    ("completions", {"model": "tiny"}, 400, "prompt", "missing_field"),
    ("chat/completions", {"model": "tiny"}, 400, "messages", "missing_field"),
    ("chat/completions", {"model": "tiny", "messages": "hi"}, 400, "messages", "invalid_type"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    # param is the validation error's location
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 3}]}, 400, "messages[1].content", "invalid_type"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content", None),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": [1, 100000000000000000000]}, 400, "prompt", None),
    ("completions", {"model": "tiny", "prompt": "hi", "seed": 18446744073709551616}, 400, "seed", None),
    ("completions", {"model": "tiny", "prompt": "x" * 2100}, 400, "prompt", "context_length_exceeded"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x" * 2100}]}, 400, "messages", "context_length_exceeded"),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens", None),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": -3}, 400, "max_tokens", None),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": 65}, 400, "max_tokens", None),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": True}, 400, "max_tokens", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": "hi", "temperature": -0.5}, 400, "temperature", None),
    ("completions", {"model": "tiny", "prompt": "hi", "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": "hi", "stream": "yes"}, 400, "stream", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": "hi", "stop": 3}, 400, "stop", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": "hi", "seed": 1.5}, 400, "seed", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": "hi", "domain": 7}, 400, "domain", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": 42}, 400, "prompt", "invalid_type"),
    ("completions", {"model": "tiny", "prompt": [999999]}, 400, "prompt", None),
    ("completions", {"model": "tiny", "prompt": "hi", "n": 2}, 400, "n", None),
    ("completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model", "model_not_found"),
    ("nowhere", {"model": "tiny"}, 404, None, None),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "param", "code"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_each_bad_request_gets_its_4xx_in_openai_shape_and_the_server_stays_healthy(server, endpoint, body, status, param, code):
    state, url = server
    served = state.worker.served
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{url}/v1/{endpoint}", content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code and err["message"]
    if param:
        assert param.split(".")[0].split("[")[0] in err["message"]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert state.worker.served == served  # refused before the model was used


def test_the_openai_client_sees_a_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=0)
    assert e.value.status_code == 400 and e.value.body["param"] == "max_tokens"


# ---------------------------------------------------------------------- stateful servers
def _hold_worker(state):
    """Block the generation worker inside its next request (it waits for the controller's
    lock); returns the lock to release."""
    lock = state.controller.lock
    lock.acquire()
    return lock


def _wait_until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_a_full_queue_answers_429_and_the_waiting_requests_are_served_in_order(tiny, tiny_target, mapping_file):
    c = tiny_controller(tiny, tiny_target, mapping_file)
    state = make_state(c, None, max_queue=1)
    with running_server(state) as url:
        lock = _hold_worker(state)
        results: dict[str, httpx.Response] = {}

        def send(name: str, prompt: str) -> None:
            results[name] = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 5}, timeout=60)

        first = threading.Thread(target=send, args=("first", "aaa"))
        first.start()
        _wait_until(lambda: state.worker.busy)
        second = threading.Thread(target=send, args=("second", "bbb"))
        second.start()
        _wait_until(lambda: state.worker.depth == 1)
        assert "tss_queue_depth 1.0" in httpx.get(url + "/metrics").text
        third = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "ccc", "max_tokens": 5}, timeout=30)
        assert third.status_code == 429
        assert third.json()["error"]["type"] == "rate_limit_error" and "max_queue" in third.json()["error"]["message"]
        # With Retry-After (lm-evaluation-harness spent its retries at once without it).
        assert 1 <= int(third.headers["retry-after"]) <= 60
        lock.release()
        first.join(60)
        second.join(60)
        assert results["first"].status_code == results["second"].status_code == 200
        # Outputs never mix: each equals its own request served alone.
        for name, prompt in (("first", "aaa"), ("second", "bbb")):
            ids = c.tokenizer(prompt, return_tensors="pt")["input_ids"][0]
            want = answer_text(c.tokenizer, plain_greedy(c, ids, frozenset(), 5))
            assert results[name].json()["choices"][0]["text"] == want


def test_many_clients_at_once_never_mix_outputs(server, client):
    state, _ = server
    c = state.controller
    prompts = [f"prompt number {i}" for i in range(8)]
    out: dict[int, str] = {}

    def ask(i: int) -> None:
        out[i] = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=8, extra_body={"domain": "qa"}).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, p in enumerate(prompts):
        ids = c.tokenizer(p, return_tensors="pt")["input_ids"][0]
        assert out[i] == answer_text(c.tokenizer, plain_greedy(c, ids, frozenset({1}), 8))


def test_a_client_that_disconnects_mid_stream_stops_its_generation(tiny, tiny_target, mapping_file, caplog):
    caplog.set_level(logging.INFO, logger="tss_opt.runtime")
    c = tiny_controller(tiny, tiny_target, mapping_file)
    # EOS never ends this request early: the tiny model would otherwise stop at random.
    c.eos_token_ids = ()
    state = make_state(c, None, max_tokens_cap=1900)
    with running_server(state) as url:
        body = {"model": "tiny", "prompt": "go", "max_tokens": 1900, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]
            assert got[0].startswith("data: ")
            assert state.worker.busy
        # The response is closed: the worker stops within a step, long before 1900 tokens.
        _wait_until(lambda: not state.worker.busy, timeout=10)
        msgs = [r.getMessage() for r in caplog.records if "cancelled by its client" in r.getMessage()]
        assert len(msgs) == 1
        n = int(msgs[0].split("after ")[1].split()[0])
        assert n < 1900
        assert _metric(httpx.get(url + "/metrics").text, "tss_requests_total") == 0  # not counted as served
        # ... but counted as cancelled, with the tokens it generated.
        _wait_until(lambda: _metric(httpx.get(url + "/metrics").text, "tss_requests_cancelled_total", endpoint="completions") == 1)
        assert _metric(httpx.get(url + "/metrics").text, "tss_generated_tokens_total") == n
        # and the server goes on serving
        assert httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}).status_code == 200


def _write_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data), encoding="utf-8")
    os.replace(tmp, path)


def test_the_mapping_is_reloaded_when_it_changes_and_another_models_is_refused(tiny, tiny_target, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tss_opt.runtime")
    path = tmp_path / "mapping.yaml"
    _write_atomically(path, mapping_data({"qa": [1]}))
    c = tiny_controller(tiny, tiny_target, path)
    state = make_state(c, path)
    with running_server(state) as url:
        cl = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        def skip_of(domain: str) -> list[int]:
            return cl.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"domain": domain}).tss["skip_set"]

        assert skip_of("qa") == [1] and skip_of("rag") == []
        _write_atomically(path, mapping_data({"qa": [3], "rag": [0, 2]}))
        assert skip_of("qa") == [3] and skip_of("rag") == [0, 2]
        assert httpx.get(url + "/health").json()["domains"] == ["qa", "rag"]
        assert any("reloaded" in r.getMessage() for r in caplog.records)
        # A mapping searched on another model: refused, the old one kept, logged.
        _write_atomically(path, mapping_data({"qa": [5]}, model="HuggingFaceTB/SmolLM2-135M-Instruct", num_layers=30))
        assert skip_of("qa") == [3]
        refused = [r for r in caplog.records if "was refused" in r.getMessage()]
        assert len(refused) == 1 and refused[0].levelno == logging.WARNING and "SmolLM2" in refused[0].getMessage()
        assert skip_of("qa") == [3]  # logged once per change, not per request
        assert len([r for r in caplog.records if "was refused" in r.getMessage()]) == 1
        m = httpx.get(url + "/metrics").text
        assert _metric(m, "tss_mapping_reloads_total", result="ok") == 1
        assert _metric(m, "tss_mapping_reloads_total", result="refused") == 1


def test_a_stalled_stream_reader_does_not_hold_the_worker(tiny, tiny_target, mapping_file):
    c = tiny_controller(tiny, tiny_target, mapping_file)
    c.eos_token_ids = ()
    state = make_state(c, None, max_tokens_cap=120)
    with running_server(state) as url:
        body = {"model": "tiny", "prompt": "stall", "max_tokens": 120, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            # Never read this stream: another request is still served, after the first one
            # finished decoding on its own.
            t0 = time.monotonic()
            other = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "next", "max_tokens": 3}, timeout=60)
            assert other.status_code == 200 and time.monotonic() - t0 < 50
            assert state.worker.served == 2


def test_the_step_hook_observes_without_changing_the_tokens(tiny, tiny_target, mapping_file):
    from tss_opt.decoding.engine import SpeculativeEngine

    c = tiny_controller(tiny, tiny_target, mapping_file)
    ids = c.tokenizer("the step hook", return_tensors="pt")["input_ids"][0]
    eng = SpeculativeEngine(c.target, c.drafter_factory(), eos_token_ids=())
    plain = eng.generate(ids, max_new_tokens=40, skip={2}).tokens.tolist()
    seen: list[int] = []
    hooked = eng.generate(ids, max_new_tokens=40, skip={2}, on_step=lambda t: seen.extend(t.tolist())).tokens.tolist()
    assert hooked == plain == seen
    steps: list[int] = []

    def stop_after_three(t) -> bool:
        steps.append(len(t))
        return len(steps) == 3

    cut = SpeculativeEngine(c.target, c.drafter_factory(), eos_token_ids=()).generate(ids, max_new_tokens=40, skip={2}, on_step=stop_after_three)
    assert cut.tokens.tolist() == plain[: sum(steps)] and len(steps) == 3 and cut.stats.new_tokens == sum(steps)


def test_text_tracker_holds_back_half_characters_and_stop_prefixes(tiny):
    from tss_opt.runtime.server.text import TextTracker

    tok = tiny.tokenizer
    text = "héllo wörld, stop here"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tr = TextTracker(tok, stop=["stop"])
    sent = ""
    for t in ids:  # one token (byte) at a time: "é" and "ö" are two bytes each
        tr.add([t])
        delta = tr.release()
        assert "\ufffd" not in delta
        sent += delta
        assert "st" != sent[-2:]  # a possible stop prefix is never released early
    sent += tr.release(final=True)
    assert tr.stopped and sent == tr.text == "héllo wörld, "
