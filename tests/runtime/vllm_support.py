"""Helpers of the vLLM plugin tests: models vLLM can load, engine jobs in their own process,
and the comparison of two token lists with its near-tie rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("vllm_job.py")
# vLLM's CPU attention supports head sizes 32, 64, ...: the usual tiny model (head 16) is
# widened to one 64-wide head pair; still 4 layers, byte-level ChatML tokenizer, random seed 0.
TINY_VLLM = {
    "name": "tiny", "source": "tiny", "num_layers": 4, "seed": 0,
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1},
}
TINY_VLLM_ID = "tiny-llama-4l-seed0"
# A divergence between two engines is accepted only where the diverging engine's top two
# log-probabilities at that position are closer than this (float32 kernels that round a
# near-tie differently); any other difference fails.
NEAR_TIE = 1e-3


def run_job(job: dict[str, Any], tmp: Path, name: str, timeout: float = 900) -> dict[str, Any]:
    """Run one vLLM engine over ``job``'s batches in a process of its own (vllm_job.py)."""
    job_path, out_path = tmp / f"{name}.job.json", tmp / f"{name}.out.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "TQDM_DISABLE": "1"}
    # One stream: vLLM logs to stdout (its worker's traceback included), Python to stderr.
    proc = subprocess.run(
        [sys.executable, str(JOB), str(job_path), str(out_path)], env=env, cwd=tmp,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        return {"failed": True, "returncode": proc.returncode, "output": proc.stdout}
    return json.loads(out_path.read_text())


@dataclass(frozen=True)
class Comparison:
    equal: bool
    near_tie: bool
    index: int | None = None  # first differing position
    gap: float | None = None


def compare(
    tokens: Sequence[int], reference: Sequence[int], logprobs: Sequence[dict[str, float]] | None = None,
    margin: float = NEAR_TIE,
) -> Comparison:
    """``tokens`` against ``reference``: equal, or a first difference at a near-tie (``tokens``'
    top-two log-probabilities there within ``margin``, default :data:`NEAR_TIE`, the reference's
    token the second)."""
    tokens, reference = list(tokens), list(reference)
    if tokens == reference:
        return Comparison(True, False)
    i = next((k for k, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    if logprobs is None or i >= len(logprobs) or i >= len(reference):
        return Comparison(False, False, i)
    top = sorted(logprobs[i].items(), key=lambda kv: -kv[1])
    gap = top[0][1] - top[1][1] if len(top) > 1 else float("inf")
    second_is_ref = len(top) > 1 and int(top[1][0]) == reference[i]
    return Comparison(False, second_is_ref and gap <= margin, i, gap)
