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
  # (bench/pytest_shards.sh; shortens the call when device time is short).
  bash bench/pytest_shards.sh "${PYTEST_SHARDS:-1}" "${PYTEST_T:-330}" "$OUT/pytest" "$@" \
    >"$OUT/pytest_shards.log" 2>&1 &
  pids+=($!)
fi
# Tests that read the device's free memory run alone (others' allocations would read as growth).
serial='NoDeviceMemoryGrowth|DeviceMemoryFlat'
(cd build-gpu && timeout 300 ctest -j 4 --timeout 240 --output-on-failure -E "$serial") >"$OUT/ctest.log" 2>&1
grep -E "tests passed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Exception" "$OUT/ctest.log" | head -30
echo "ctest $(($(date +%s) - t0)) s"
if [ ${#pids[@]} -gt 0 ]; then
  wait "${pids[@]}"
  cat "$OUT/pytest_shards.log"
  echo "pytest $(($(date +%s) - t0)) s"
fi
# BEFORE_SERIAL: a command run first (e.g. waiting for a measurement the caller started in the
# background, so that nothing else holds device memory while these tests read it).
eval "${BEFORE_SERIAL:-}"
(cd build-gpu && ctest --timeout 240 --output-on-failure -R "$serial") >"$OUT/ctest_serial.log" 2>&1
grep -E "tests passed|\(Failed\)" "$OUT/ctest_serial.log"
echo "total $(($(date +%s) - t0)) s"
