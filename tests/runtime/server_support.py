"""Starting the real server (uvicorn on a free port, in a thread) over the tiny model."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from runtime_support import TINY_ID, pld

from tss_opt.decoding.target import TargetModel
from tss_opt.models import LoadedModel
from tss_opt.runtime import DomainRouter, TSSController
from tss_opt.runtime.server import ServerSettings, ServingState, make_server

ROUTER_PROMPTS = {
    "qa": ["Who wrote Hamlet?", "What is the capital of France?", "When did the war end?"],
    "translation": [
        "Translate German to English: Das Haus ist gross.",
        "Translate German to English: Ich habe Hunger.",
        "Translate German to English: Der Hund schlaeft.",
    ],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_router(tiny: LoadedModel, target: TargetModel) -> DomainRouter:
    """A router on a few prompts per domain, threshold -1: every request goes to its nearest
    domain (the background class is left out)."""
    from tss_opt.evaluation.domains import Example, format_prompt

    prompts = {
        d: [format_prompt(tiny.tokenizer, Example(id=f"{d}{i}", prompt=p, references=()), None) for i, p in enumerate(ps)]
        for d, ps in ROUTER_PROMPTS.items()
    }
    return DomainRouter.fit(target, prompts, threshold=-1.0, model_id=TINY_ID)


def tiny_controller(tiny: LoadedModel, target: TargetModel, mapping: Path, router: DomainRouter | None = None, **kw: Any) -> TSSController:
    return TSSController(
        target, tiny.tokenizer, mapping, pld, tiny.eos_token_ids, router, model_id=TINY_ID,
        max_new_tokens=kw.pop("max_new_tokens", 12), **kw,
    )


# The running servers by base URL (a test that signals one reaches it here).
SERVERS: dict[str, Any] = {}


@contextmanager
def running_server(state: ServingState, log_level: str = "warning") -> Iterator[str]:
    """Serve ``state`` on a free port; yields the base URL; stops the server afterwards."""
    state.settings = replace(state.settings, port=free_port())
    server = make_server(state, log_level)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{state.settings.port}"
    SERVERS[url] = server
    try:
        yield url
    finally:
        SERVERS.pop(url, None)
        server.should_exit = True
        thread.join(30)


def make_state(controller: TSSController, mapping: Path | None = None, **settings: Any) -> ServingState:
    return ServingState(controller, ServerSettings(**settings), "tiny", str(mapping) if mapping else None)


def plain_greedy(controller: TSSController, ids: torch.Tensor, skip: frozenset[int], n: int) -> list[int]:
    """The reference: the same request through the engine directly."""
    from tss_opt.decoding.engine import SpeculativeEngine

    eng = SpeculativeEngine(controller.target, controller.drafter_factory(), eos_token_ids=controller.eos_token_ids)
    return eng.generate(ids, max_new_tokens=n, skip=skip).tokens.tolist()


def answer_text(tokenizer: Any, ids: list[int]) -> str:
    """The answer the server gives for ``ids``: decoded without special tokens, and ending
    before an incomplete last character (the tiny model writes random bytes)."""
    return tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


# ------------------------------------------------------------------ the command (subprocess)
def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TSS_API_KEY"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]), **extra)
    return env


def start_command(args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """Start the serve command; returns it and its base URL once uvicorn listens."""
    out = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "tss_opt.cli.serve", "+model=tiny", "port=0", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = re.search(r"Uvicorn running on http://[^:]+:(\d+)", log.read_text())
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {log.read_text()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server did not start: {log.read_text()}")


def stop_command(proc: subprocess.Popen, sig: int = signal.SIGINT) -> int | None:
    """Stop the command with ``sig``; its exit status (``None``: it had to be killed)."""
    proc.send_signal(sig)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
