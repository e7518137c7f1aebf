# Sourced (never run) by the one-device-call scripts: bench/gpu_check.sh, bench/e2e/diag_stall.sh,
# bench/e2e/probe_gpu.sh. Sets the device call's environment (OUT, the bundled dependencies, CUDA
# on PATH, NVLink multicast off), starts the clock t0, and defines gpu_build [TARGETS...]: configure
# and build build-gpu with logs under $OUT, exiting with the log's tail when either step fails.
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
eval "$(bash tools/gpu-deps.sh unpack)" >/dev/null
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD/python
t0=$(date +%s)

gpu_build() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$(command -v python3)" \
    -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$OUT/cfg.log" 2>&1 ||
    { tail -30 "$OUT/cfg.log"; exit 1; }
  grep -E "LoongForge:" "$OUT/cfg.log"
  cmake --build build-gpu -j16 "$@" >"$OUT/build.log" 2>&1 ||
    { grep -B2 -A12 "error" "$OUT/build.log" | head -80; exit 1; }
  echo "build $(($(date +%s) - t0)) s"
}
