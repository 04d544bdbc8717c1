#!/usr/bin/env bash
# The GPU check (issues 21 and 24): under 10 minutes on one GPU; a reduced run on a CPU.
#   bash benchmarks/gpu_check.sh                                   # cuda when present, else reduced CPU mode
#   GPU_CHECK_MODEL_PATH=/path/to/llama-2-7b bash benchmarks/gpu_check.sh   # + a local checkpoint
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh               # force the reduced CPU mode
# Settings and what it checks: benchmarks/gpu_check.py's docstring. Exit 1 when a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing outside the machine is reachable
exec python benchmarks/gpu_check.py "$@"
