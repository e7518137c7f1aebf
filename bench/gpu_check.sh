#!/usr/bin/env bash
# Quick GPU check (one device call): configure + build build-gpu, then ctest and the given pytest
# files side by side (the GPU has room for both), then the tests that read the device's free
# memory, alone. A shorter `bench/gpu_suite.sh test` for checking a change in one device call.
#   bash bench/gpu_check.sh [PYTEST_FILES...]
set -uo pipefail
source bench/gpu_env.sh
gpu_build
pid=
if [ $# -gt 0 ]; then
  timeout "${PYTEST_T:-330}" python3 -m pytest -q -p no:cacheprovider -rfs "$@" >"$OUT/pytest.log" 2>&1 &
  pid=$!
fi
# Tests that read the device's free memory run alone (others' allocations would read as growth).
serial='NoDeviceMemoryGrowth|DeviceMemoryFlat'
(cd build-gpu && timeout 300 ctest -j 4 --timeout 240 --output-on-failure -E "$serial") >"$OUT/ctest.log" 2>&1
grep -E "tests passed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Exception" "$OUT/ctest.log" | head -30
echo "ctest $(($(date +%s) - t0)) s"
if [ -n "$pid" ]; then
  wait "$pid"
  grep -E "passed|failed|FAILED|Error" "$OUT/pytest.log" | tail -25
  echo "pytest $(($(date +%s) - t0)) s"
fi
(cd build-gpu && ctest --timeout 240 --output-on-failure -R "$serial") >"$OUT/ctest_serial.log" 2>&1
grep -E "tests passed|\(Failed\)" "$OUT/ctest_serial.log"
echo "total $(($(date +%s) - t0)) s"
