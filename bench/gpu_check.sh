#!/usr/bin/env bash
# Quick GPU check (one device call): configure + build build-gpu, then ctest and the given pytest
# files side by side (the GPU has room for both), then the tests that read the device's free
# memory, alone. A shorter `bench/gpu_suite.sh test` for checking a change in one device call.
#   [PYTEST_SHARDS=N] bash bench/gpu_check.sh [PYTEST_FILES_OR_DIRS...]
set -uo pipefail
source bench/gpu_env.sh
gpu_build
pids=()
if [ $# -gt 0 ]; then
  # PYTEST_SHARDS=N: N pytest processes side by side, the collected tests dealt out one by one
  # (the GPU and 16 cores have room; shortens the call when device time is short). Tests, not
  # files: test_train.py's GPU trainer runs alone outlast a whole shard of other files (run N1:
  # 34 of its 40 tests in 450 s); dealt one by one, every file's slow tests are spread out.
  shards=${PYTEST_SHARDS:-1}
  # node ids, each once (a warnings summary may repeat some)
  mapfile -t ids < <(python3 -m pytest -q -p no:cacheprovider --collect-only "$@" 2>/dev/null |
    awk '/::/ && !/^[[:space:]]/ && !seen[$0]++')
  [ ${#ids[@]} -gt 0 ] || ids=("$@")  # collection failed: one shard runs it, and reports why
  for ((k = 0; k < shards; k++)); do
    mine=()
    for ((i = k; i < ${#ids[@]}; i += shards)); do mine+=("${ids[i]}"); done
    [ ${#mine[@]} -gt 0 ] || continue
    timeout "${PYTEST_T:-330}" python3 -m pytest -q -p no:cacheprovider -rfs "${mine[@]}" \
      >"$OUT/pytest$k.log" 2>&1 &
    pids+=($!)
  done
fi
# Tests that read the device's free memory run alone (others' allocations would read as growth).
serial='NoDeviceMemoryGrowth|DeviceMemoryFlat'
(cd build-gpu && timeout 300 ctest -j 4 --timeout 240 --output-on-failure -E "$serial") >"$OUT/ctest.log" 2>&1
grep -E "tests passed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Exception" "$OUT/ctest.log" | head -30
echo "ctest $(($(date +%s) - t0)) s"
if [ ${#pids[@]} -gt 0 ]; then
  wait "${pids[@]}"
  for f in "$OUT"/pytest*.log; do grep -E "passed|failed|FAILED|Error" "$f" | tail -12; done
  echo "pytest $(($(date +%s) - t0)) s"
fi
# BEFORE_SERIAL: a command run first (e.g. waiting for a measurement the caller started in the
# background, so that nothing else holds device memory while these tests read it).
eval "${BEFORE_SERIAL:-}"
(cd build-gpu && ctest --timeout 240 --output-on-failure -R "$serial") >"$OUT/ctest_serial.log" 2>&1
grep -E "tests passed|\(Failed\)" "$OUT/ctest_serial.log"
echo "total $(($(date +%s) - t0)) s"
