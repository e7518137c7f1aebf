#!/usr/bin/env bash
# The headline table, one device call per batch size (docs/BENCHMARKS.md opens with it):
# build, the 40,000-sample DB (make_db.sh), the GPU tests in TESTS beside the DB's generation
# (they share only the machine's CPUs while it packs), then bench/e2e/run.py with every row in
# this one call.
#   BATCH=16 bash bench/e2e/headline.sh
#   BATCH=64 STEPS=260 TESTS="" bash bench/e2e/headline.sh
# STEPS (320, warm-up included), WARMUP (20), MODES, ROW_T (seconds per row) and EXTRA_ALL
# (trainer flags of every row; default --init-device device: the same init in every row, 30 s
# less start-up each) override.
set -uo pipefail
source bench/gpu_env.sh
gpu_build --target _C loongforge
batch=${BATCH:-16}
if [ -n "${TESTS-tests/python/test_gpu_baselines.py}" ]; then
  ( timeout "${TESTS_T:-240}" python3 -m pytest -q -p no:cacheprovider -rfs \
      ${TESTS-tests/python/test_gpu_baselines.py} >"$OUT/pytest.log" 2>&1
    echo "tests rc $? at $(($(date +%s) - t0)) s" >>"$OUT/pytest.log" ) &
  tests=$!
fi
db=$(bash bench/e2e/make_db.sh build-gpu/loongforge)
echo "db ready $(($(date +%s) - t0)) s"
if [ -n "${tests:-}" ]; then
  wait "$tests"
  grep -E "passed|failed|skipped|SKIP|FAIL|Error|tests rc" "$OUT/pytest.log" | tail -15
fi
python3 bench/e2e/run.py --db "$db" --config n16 --batches "$batch" --steps "${STEPS:-320}" \
  --warmup "${WARMUP:-20}" --modes "${MODES:-lerobot,tuned,tuned+graphs,loongforge}" \
  --workers 16 --loader-threads 12 --row-timeout "${ROW_T:-0}" --out "$OUT/e2e_b$batch" \
  --extra-all "${EXTRA_ALL:---init-device device}" \
  >"$OUT/e2e_b$batch.log" 2>&1
grep -E "^\\$|did not finish|Error|error:" "$OUT/e2e_b$batch.log" | cut -c1-300 | head -20
sed -n '/^machine:/,$p' "$OUT/e2e_b$batch.log"
echo "total $(($(date +%s) - t0)) s"
