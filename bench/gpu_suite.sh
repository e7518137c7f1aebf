#!/usr/bin/env bash
# One script for the GPU machine (see ../shared/GPU.md): builds with CUDA, runs every C++ test
# (GPU tests included), the Python tests under torch 2.x, and the GPU benchmarks. Writes logs and
# JSON under ${OUT:-results/gpu}; prints a short summary last.
#
#   bash bench/gpu_suite.sh            # from the repo root, with .gpudeps/ carried along
set -uo pipefail
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
eval "$(bash tools/gpu-deps.sh unpack)"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  tail -n 25 "$OUT/$name.log"
  return $rc
}
step configure 300 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$(command -v $PY)" \
  -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)"
step build 600 cmake --build build-gpu -j 16
step ctest 600 bash -c "cd build-gpu && ctest --output-on-failure -j 4 --timeout 300"
export PYTHONPATH=$PWD/python
step pytest 600 $PY -m pytest -q -p no:cacheprovider tests/python
for s in bench/*/gpu_run.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$(dirname "$s")")
  step "bench_$n" 600 bash "$s" "$OUT"
done
echo; echo "== summary =="; printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
