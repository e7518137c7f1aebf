#!/usr/bin/env bash
# One-shot GPU run for issue 7 (DataFusion on the GPU), from the repo root on the GPU machine:
# builds with CUDA + nvJPEG, runs the GPU C++ tests, the Python GPU tests, and the GPU loader
# benchmark. Everything lands in $OUT (default results/gpu): configure/build/test logs, gtest
# JSON, gpu_bench.json. Each step is time-bounded and a failing step does not stop the others;
# the exit status is non-zero if any step failed. Budget: about 4 minutes on an H200 host with 16
# cores (build ~2 min, tests ~40 s, benchmark ~1.5 min); the per-step limits below are the
# worst case.
#
#   OUT=/some/dir bash bench/loader/gpu_run.sh      (standalone)
#   bash bench/loader/gpu_run.sh OUTDIR              (from bench/gpu_suite.sh, which has already
#                                                     built build-gpu and run every test)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/results/gpu}}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
status=0
step() {  # step NAME TIMEOUT_S CMD...: runs CMD, logs to $OUT/NAME.log, prints its tail
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T))"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  echo "=== $name: exit $rc"
  [ $rc -eq 0 ] || status=1
  return $rc
}

eval "$(bash tools/gpu-deps.sh unpack)"
export PATH=/usr/local/cuda/bin:$PATH
PY=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"

if [ ! -x "$BUILD/loongforge_tests" ]; then
step configure 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$PY" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" || exit 1
grep -q "nvJPEG=ON" "$OUT/configure.log" || echo "WARNING: nvJPEG not found: GPU loader tests will skip"
step build 240 cmake --build "$BUILD" -j "$(nproc)" || exit 1
fi

# C++: image and stage-3 kernels vs CPU references, nvJPEG decoder (incl. 100k-decode leak check),
# GPU loader vs CPU loader (static buckets, device stage 3), plus the CPU loader suites.
[ -n "${LF_SUITE:-}" ] || step gtest_gpu 180 "./$BUILD/loongforge_tests" \
  --gtest_filter='ImageKernels.*:Collate*:NvJpegDecoder.*:GpuLoaderTest.*:ImageOps.*:LoaderTest.*:Sampler.*' \
  --gtest_output=json:"$OUT/gtest_gpu.json"

# Python: DLPack CUDA tensors, side-stream consumer, fallback report, static buckets on the GPU.
[ -n "${LF_SUITE:-}" ] || PYTHONPATH=python step pytest_gpu 120 "$PY" -m pytest -q -s \
  tests/python/test_data_gpu.py tests/python/test_data.py

# Benchmark: GPU loader (default, static buckets, bf16/NHWC, A/B rows) vs nvJPEG alone vs
# torchvision GPU decode vs DataLoader+PIL (16 workers, file_system sharing).
PYTHONPATH=python OUT="$OUT" step bench 240 "$PY" bench/loader/gpu_bench.py --out "$OUT"

echo "=== summary"
if [ -z "${LF_SUITE:-}" ]; then
  grep -h -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/gtest_gpu.log" | head -20
  tail -n 3 "$OUT/pytest_gpu.log"
fi
sed -n '/^GPU loader benchmark/,$p' "$OUT/bench.log"
exit $status
