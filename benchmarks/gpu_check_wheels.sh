#!/usr/bin/env bash
# Pure-Python wheels that the lent GPU machine's image lacks (it has torch, transformers,
# accelerate, safetensors, sacrebleu, scipy, pyyaml): built here into .whl/ (ignored by git
# through .git/info/exclude), carried by the device tool, installed by benchmarks/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
mkdir -p .whl
python3 -m pip wheel -q --no-deps -w .whl \
  hydra-core==1.3.8 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 rouge-score==0.1.2 nltk==3.10.4
ls -la .whl
