#!/usr/bin/env bash
# End-to-end comparison on one GPU (called by bench/gpu_suite.sh from the repo root; $1 = output
# dir). n16 at batch 16, the three modes, 640x480 two-camera data. Kept inside one device call:
# STEPS/WARMUP/CKPT_EVERY/MODES/BATCHES override the defaults.
set -uo pipefail
source bench/e2e/common.sh "${1:-results/gpu}"  # out, PY, db
$PY bench/e2e/run.py --db "$db" --config "${CONFIG:-n16}" --batches "${BATCHES:-16}" \
  --modes "${MODES:-baseline,tuned,loongforge}" --steps "${STEPS:-40}" --warmup "${WARMUP:-10}" \
  --ckpt-every "${CKPT_EVERY:-0}" --workers 16 --loader-threads 12 --out "$out/e2e"
