#!/usr/bin/env bash
# Issue 9 ablation on one GPU ($1 = output dir; run from the repo root after building build-gpu,
# e.g. by `bash bench/gpu_suite.sh test`). ROWS / BATCHES / STEPS / WARMUP / CONFIG override.
set -uo pipefail
out=${1:-results/gpu}
mkdir -p "$out"
PY=${PY:-python3}
cli=${BUILD:-build-gpu}/loongforge
db=/tmp/lf_e2e_db
if [ ! -f "$db/data.mdb" ]; then
  "$cli" demo-data --out /tmp/lf_e2e_raw --episodes 33 --cameras 2 --size 640x480 | tail -2
  "$cli" pack --src /tmp/lf_e2e_raw --out "$db" --overwrite | tail -2
fi
$PY bench/e2e/ablation.py --db "$db" --config "${CONFIG:-n16}" --batches "${BATCHES:-16,64}" \
  --rows "${ROWS:-default,eager,static,syncfree,graphs,compile,fused}" --steps "${STEPS:-30}" \
  --warmup "${WARMUP:-10}" --buckets "${BUCKETS:-64}" --steps-for "${STEPS_FOR:-}" \
  --batches-for "${BATCHES_FOR:-}" --timeout "${RUN_TIMEOUT:-240}" \
  --out "$out/${NAME:-ablation}" ${EXTRA:+--extra "$EXTRA"}
