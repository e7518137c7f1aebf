#!/usr/bin/env bash
# The tuned+compile row (issue 17): tuned PyTorch with torch.compile of the whole model, n16 at
# TC_BATCH (16), TC_STEPS (100) steps, in its own device call (compiling the whole model takes
# minutes: the row's warm-up column gives it). While it compiles (host CPU work), the GPU tests of
# TEST_FILES (PYTEST_K selects) run beside it; both sides print wall-clock marks, so that the
# row's timed steps can be checked to come after the tests ended (they share nothing else).
#   TC_BATCH=16 TEST_FILES="tests/python/test_compile_blocks.py" bash bench/e2e/tuned_compile_row.sh
set -uo pipefail
source bench/gpu_env.sh
gpu_build
db=$(bash bench/e2e/make_db.sh build-gpu/loongforge)
echo "row start $(($(date +%s) - t0)) s"
( timeout "${TC_T:-520}" python3 bench/e2e/run.py --db "$db" --config n16 --batches "${TC_BATCH:-16}" \
    --modes tuned+compile --steps "${TC_STEPS:-100}" --warmup 10 --ckpt-every 0 --workers 16 \
    --loader-threads 12 --out /tmp/e2e_tc --extra-all "--init-device device" >"$OUT/e2e_tc.log" 2>&1
  echo "== tuned+compile: rc $? at $(($(date +%s) - t0)) s" ) &
row=$!
if [ -n "${TEST_FILES:-}" ]; then
  timeout "${TESTS_T:-300}" python3 -m pytest -q -p no:cacheprovider -rfs ${TEST_FILES} \
    ${PYTEST_K:+-k "$PYTEST_K"} >"$OUT/pytest_tc.log" 2>&1
  echo "tests rc $? end $(($(date +%s) - t0)) s"
  grep -E "passed|failed" "$OUT/pytest_tc.log" | tail -3
fi
wait $row
grep -vE "demo-data|pack:" "$OUT/e2e_tc.log" | grep -E "tokens/GPU|warm-up|start-up|step [0-9]+/|^tuned|MFU|memory" | head -30
echo "total $(($(date +%s) - t0)) s"
