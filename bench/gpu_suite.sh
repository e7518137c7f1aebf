#!/usr/bin/env bash
# One script for the GPU machine, in phases so each fits in 10 minutes:
#
#   bash bench/gpu_suite.sh test            # configure + build (build-gpu/), ctest (GPU tests run),
#                                           # pytest under torch 2.x (six shards)
#   bash bench/gpu_suite.sh bench [NAMES]   # bench/<name>/gpu_run.sh for each name (default: all)
#
# From the repo root, with .gpudeps/ carried along (tools/gpu-deps.sh fetch on a CPU machine).
# Logs and JSON go to ${OUT:-results/gpu}; a short summary is printed last.
set -uo pipefail
phase=${1:-test}
shift || true
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LF_SUITE=1 BUILD=build-gpu
eval "$(bash tools/gpu-deps.sh unpack)"
export PATH=/usr/local/cuda/bin:$PATH
PY=${PY:-python3}
export PY
summary=()
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 t=$2
  shift 2
  local t0
  t0=$(date +%s)
  echo "=== $name ($(date +%T))"
  timeout "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-4s %4ss' "$name" "$rc" "$(($(date +%s) - t0))")")
  tail -n 30 "$OUT/$name.log"
  return $rc
}

counts() {  # one line per test runner: passed / skipped / failed, each counted on its own
  local f n
  for f in "$OUT/ctest.log" "$OUT/ctest_serial.log"; do
    [ -f "$f" ] || continue
    n=$(grep -oE "[0-9]+ tests failed out of [0-9]+" "$f" | tail -1)
    [ -n "$n" ] || { echo "$(basename "$f" .log): no summary (cut or not run)"; continue; }
    local failed total skipped
    failed=${n%% *}; total=${n##* }
    skipped=$(grep -cE "\(Skipped\)|\(Not Run\)|\(Disabled\)" "$f")
    echo "$(basename "$f" .log): $((total - failed - skipped)) passed, $skipped skipped," \
      "$failed failed (of $total)"
  done
  if ls "$OUT"/pytest[0-9]*.log >/dev/null 2>&1; then
    for f in "$OUT"/pytest[0-9]*.log; do
      grep -E "^=*[ ]*[0-9]+ [a-z]+.* in [0-9.]+s" "$f" | tail -1
    done | grep -oE "[0-9]+ (passed|skipped|failed|errors?)" |
      awk '{k=$2; sub(/errors?/, "error", k); c[k]+=$1}
           END {printf "pytest: %d passed, %d skipped, %d failed, %d errors\n",
                c["passed"], c["skipped"], c["failed"], c["error"]}'
  fi
}

case "$phase" in
  test)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
    step configure 240 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$(command -v "$PY")" \
      -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)"
    grep -E "LoongForge:" "$OUT/configure.log"
    step build 360 cmake --build build-gpu -j "$(nproc)"
    export PYTHONPATH=$PWD/python
    # pytest in six processes (bench/pytest_shards.sh: one process takes longer than a device call
    # since the trainer's GPU tests compile their blocks), beside ctest (the GPU has room for both)
    t_py=$(date +%s)
    echo "=== pytest, ${PYTEST_SHARDS:-6} shards, in the background ($(date +%T))"
    bash bench/pytest_shards.sh "${PYTEST_SHARDS:-6}" 450 "$OUT/pytest" tests/python \
      >"$OUT/pytest.log" 2>&1 &
    py=$!
    # Tests that read the device's free memory (cudaMemGetInfo) run alone, after pytest: other
    # tests' allocations on the same GPU would read as growth.
    serial='NoDeviceMemoryGrowth|DeviceMemoryFlat'
    step ctest 300 bash -c "cd build-gpu && ctest --output-on-failure -j 4 --timeout 240 -E '$serial'"
    grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest.log" | head -30
    wait $py
    rc=$?
    summary+=("$(printf '%-22s rc=%-4s %4ss' pytest "$rc" "$(($(date +%s) - t_py))")")
    echo "=== pytest"; cat "$OUT/pytest.log"
    step ctest_serial 300 bash -c "cd build-gpu && ctest --output-on-failure --timeout 240 -R '$serial'"
    ;;
  bench)
    export PYTHONPATH=$PWD/python
    names=("$@")
    if [ ${#names[@]} -eq 0 ]; then
      for s in bench/*/gpu_run.sh; do names+=("$(basename "$(dirname "$s")")"); done
    fi
    for n in "${names[@]}"; do
      step "bench_$n" 420 bash "bench/$n/gpu_run.sh" "$OUT"
    done
    ;;
  *) echo "usage: $0 test | bench [names]" >&2; exit 2 ;;
esac
echo; echo "== summary =="; printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
if [ "$phase" = test ]; then counts | tee -a "$OUT/summary.txt"; fi
