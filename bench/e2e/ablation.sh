#!/usr/bin/env bash
# Issue 9 ablation on one GPU ($1 = output dir; run from the repo root after building build-gpu,
# e.g. by `bash bench/gpu_suite.sh test`). ROWS / BATCHES / STEPS / WARMUP / CONFIG override.
set -uo pipefail
source bench/e2e/common.sh "${1:-results/gpu}"  # out, PY, db
$PY bench/e2e/ablation.py --db "$db" --config "${CONFIG:-n16}" --batches "${BATCHES:-16,64}" \
  --rows "${ROWS:-default,eager,static,syncfree,graphs,compile,fused}" --steps "${STEPS:-30}" \
  --warmup "${WARMUP:-10}" --buckets "${BUCKETS:-64}" --steps-for "${STEPS_FOR:-}" \
  --batches-for "${BATCHES_FOR:-}" --timeout "${RUN_TIMEOUT:-240}" \
  --out "$out/${NAME:-ablation}" ${EXTRA:+"--extra=$EXTRA"}
