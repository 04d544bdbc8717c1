#!/usr/bin/env bash
# The GPU check (engine exactness and speed, batching, TSS inside vLLM): under 10 minutes on one GPU; a reduced run on a CPU.
#   bash benchmarks/gpu_check.sh                                   # cuda when present, else reduced CPU mode
#   GPU_CHECK_MODEL_PATH=/path/to/llama-2-7b bash benchmarks/gpu_check.sh   # + a local checkpoint
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh               # force the reduced CPU mode
#   GPU_CHECK_SECTIONS=6 bash benchmarks/gpu_check.sh               # TSS inside vLLM alone (needs vLLM:
#                                                                    pip install vllm==0.32.0; skipped without)
# Settings and what it checks: benchmarks/gpu_check.py's docstring. Exit 1 when a check failed.
#
# On the lent GPU machine (its image lacks hydra-core, omegaconf, antlr4, rouge-score, nltk):
#   here, once:  bash benchmarks/gpu_check_wheels.sh      (pure-Python wheels into .whl/, ~2 MB)
#   device tool: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
# The wheels in .whl/ are installed into /tmp/gpu_check_site first; with $OUT set (the device
# tool) the report is also written to $OUT/gpu_check.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRA=""
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_check_site .whl/*.whl
  EXTRA=":/tmp/gpu_check_site"
fi
export PYTHONPATH="$PWD$EXTRA${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing outside the machine is reachable
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  "$PY" benchmarks/gpu_check.py "$@" 2>&1 | tee "$OUT/gpu_check.txt"
  exit "${PIPESTATUS[0]}"
fi
exec "$PY" benchmarks/gpu_check.py "$@"
