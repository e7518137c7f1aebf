#!/usr/bin/env bash
# The transformers-built policy through Forge against torch.compile(mode="reduce-overhead") and
# eager PyTorch, on one GPU (bench/forge/hf_policy.py), at the batch sizes in BATCHES.
# Called by bench/gpu_suite.sh from the repo root; $1 = output dir.
set -uo pipefail
out=${1:-results/gpu}
mkdir -p "$out"
for b in ${BATCHES:-16 64}; do
  timeout "${ROW_T:-300}" "${PY:-python3}" bench/forge/hf_policy.py --out "$out/hf_policy_b$b.json" \
    --batch "$b" --steps "${STEPS:-50}" >"$out/hf_policy_b$b.log" 2>&1
  echo "batch $b: rc $?"
  grep -E "^(eager|compile|forge)|vs torch|\[(forge|cuda-graph)\]" "$out/hf_policy_b$b.log" | cut -c1-300
done
