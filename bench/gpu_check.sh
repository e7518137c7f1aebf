#!/usr/bin/env bash
# Quick GPU check (one device call): configure + build build-gpu, then ctest and the given pytest
# files side by side (the GPU has room for both), then the tests that read the device's free
# memory, alone. A shorter `bench/gpu_suite.sh test` for checking a change in one device call.
#   bash bench/gpu_check.sh [PYTEST_FILES...]
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
eval "$(bash tools/gpu-deps.sh unpack)" >/dev/null
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD/python
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$(command -v python3)" \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$OUT/cfg.log" 2>&1 || { tail -30 "$OUT/cfg.log"; exit 1; }
grep -E "LoongForge:" "$OUT/cfg.log"
cmake --build build-gpu -j16 >"$OUT/build.log" 2>&1 || { grep -B2 -A12 "error" "$OUT/build.log" | head -80; exit 1; }
echo "build $(($(date +%s) - t0)) s"
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
