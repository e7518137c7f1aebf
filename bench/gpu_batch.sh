#!/usr/bin/env bash
# Batches of GPU work sized for one device call each (10 minutes), as run for docs/BENCHMARKS.md:
#   bash bench/gpu_batch.sh build      configure + build build-gpu (skipped when built)
#   bash bench/gpu_batch.sh A          build, every C++ test, GPU pytest of the trainer/loader/
#                                      memory, then the loader bench
#   bash bench/gpu_batch.sh B          build, memory traces + bench, checkpoint tests + bench
#   bash bench/gpu_batch.sh C          build, the issue-9 ablation (ROWS/BATCHES/... env)
#   bash bench/gpu_batch.sh curves     build, GPU pytest of the graphs, the issue-9 loss curves
#   bash bench/gpu_batch.sh D          build; decoder/loader/ckpt/cuFile/allocator GPU tests (beside
#                                      them a MemSculptor diagnosis run of the trainer), the loader
#                                      bench, the checkpoint writer bench; then, if time is left
#                                      (D_BUDGET s in all), the lean step + torch.compile row
#   bash bench/gpu_batch.sh E          build; the cuFile writer's tests and bench (+ cufile.log);
#                                      then the compile row if time is left (E_BUDGET s in all)
#   bash bench/gpu_batch.sh F          build; the decoder/loader GPU tests, then the loader bench
#   bash bench/gpu_batch.sh G          build; decoder/loader gtests, GPU pytest of the loader and the
#                                      graphs, a MemSculptor diagnosis run of the eager trainer (in
#                                      the background), then the whole loader bench
# Output under $OUT (default results/gpu).
set -uo pipefail
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
eval "$(bash tools/gpu-deps.sh unpack)" >/dev/null 2>&1
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD/python BUILD=build-gpu LF_SUITE=1
PY=$(command -v python3)
t0=$(date +%s)
el() { echo "[+$(( $(date +%s) - t0 )) s] $*"; }
build() {
  if [ ! -x build-gpu/loongforge_tests ] || [ "${REBUILD:-1}" = 1 ]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$PY" \
      -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >"$OUT/configure.log" 2>&1 ||
      { tail -30 "$OUT/configure.log"; exit 1; }
    grep -E "LoongForge:" "$OUT/configure.log" | head -5
    cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1 ||
      { grep -B3 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }
  fi
  el "built"
}
# The checkpoint writers (POSIX vs cuFile) on the device state ($1 = timeout, $2 = --budget-s).
ckpt_writers() {
  timeout "$1" "$PY" bench/ckpt/gpu_bench.py --skip-baselines --modes on --writers posix,cufile \
    --budget-s "$2" --dir /tmp/lf_ckpt_gpu --out "$OUT/bench_ckpt_writers.json" \
    >"$OUT/bench_ckpt_writers.log" 2>&1
  tail -25 "$OUT/bench_ckpt_writers.log"; el "ckpt writers"
}
# The lean step + torch.compile row at batch 16, if more than $2 s of the phase's $1 s are left.
compile_row() {
  local left=$(( $1 - ($(date +%s) - t0) ))
  if [ "$left" -gt "$2" ]; then
    NAME=compile BATCHES=16 ROWS=lean STEPS=30 WARMUP=8 EXTRA=--compile-frozen \
      RUN_TIMEOUT=$((left - 15)) timeout $((left - 5)) bash bench/e2e/ablation.sh /tmp/lf_abl 2>&1 |
      grep -v "^pack:" | tail -8
    cp /tmp/lf_abl/compile/results.json "$OUT/ablation_compile.json" 2>/dev/null
  else
    echo "no time left for the compile row ($left s)"
  fi
  el "done"
}
# MemSculptor in the eager trainer (in the background): record 6 steps (trace kept), plan, 6 more.
memdiag_start() {
  db=$(bash bench/e2e/make_db.sh build-gpu/loongforge 2>/dev/null)
  mkdir -p /tmp/lf_memdiag
  (LOONGFORGE_MEM_TRACE=/tmp/lf_memdiag/trainer_b16.trace LOONGFORGE_MEM_RECORD_STEPS=6 \
    timeout 200 "$PY" -m loongforge.train --config n16 --data "$db" --mode loongforge \
    --batch-size 16 --steps 12 --warmup 4 --loader-threads 4 --quiet \
    --json-out /tmp/lf_memdiag/trainer_b16.json --adamw auto --cuda-graph off --sync-free off \
    --token-buckets "" >/tmp/lf_memdiag/trainer.log 2>&1; echo "memdiag rc=$?") &
  diag=$!
}
memdiag_end() {
  wait $diag
  "$PY" -c "
import json; s=json.load(open('/tmp/lf_memdiag/trainer_b16.json')); m=s['figures']['memory']
ms=m.get('memsculptor', {}); print('memdiag:', {k: ms.get(k) for k in ('planned_hits',
'planned_misses','planned_skips','planned_steps','pool_allocs','num_allocs','last_miss',
'fragmentation')}, 'step p50', s['figures']['step_ms_p50'])" 2>&1 | tail -3
  tail -3 /tmp/lf_memdiag/trainer.log
  zstd -q -f /tmp/lf_memdiag/trainer_b16.trace 2>/dev/null || gzip -f /tmp/lf_memdiag/trainer_b16.trace
  tar czf "$OUT/memdiag.tgz" -C /tmp/lf_memdiag . ; el "memdiag"
}
case "${1:-A}" in
  build) build ;;
  A)
    build
    (cd build-gpu && timeout 240 ctest -j 4 --timeout 200 --output-on-failure) >"$OUT/ctest.log" 2>&1
    grep -E "tests passed|Failed|\*\*\*|Exception" "$OUT/ctest.log" | head -30; el "ctest"
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_graphs.py \
      tests/python/test_train.py tests/python/test_data_gpu.py tests/python/test_data.py \
      tests/python/test_memory.py tests/python/test_replay_traces.py >"$OUT/pytest.log" 2>&1
    tail -25 "$OUT/pytest.log"; el "pytest"
    timeout 200 "$PY" bench/loader/gpu_bench.py --out "$OUT" >"$OUT/loader_bench.log" 2>&1
    tail -40 "$OUT/loader_bench.log"; el "loader bench"
    ;;
  B)
    build
    timeout "${MEM_T:-300}" bash bench/memory/gpu_run.sh "$OUT/memory" 2>&1 | tail -60; el "memory"
    timeout "${CKPT_T:-200}" bash bench/ckpt/gpu_run.sh "$OUT/ckpt" 2>&1 | tail -40; el "ckpt"
    ;;
  traces)
    # The real traces for bench/traces/ (one tar: the device tool returns few files).
    build
    timeout 150 "$PY" bench/memory/capture_traces.py --out /tmp/lf_traces 2>&1 | tail -8
    tar cf "$OUT/traces.tar" -C /tmp/lf_traces $(cd /tmp/lf_traces && ls *.trace.zst *.json)
    el "traces"
    ;;
  C)
    build
    if [ "${GRAPH_TESTS:-1}" = 1 ]; then
      timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_graphs.py 2>&1 | tail -5
      el "test_graphs"
    fi
    timeout "${C_T:-540}" bash bench/e2e/ablation.sh /tmp/lf_abl 2>&1 | grep -v "^pack:" | tail -60
    cp /tmp/lf_abl/"${NAME:-ablation}"/results.json "$OUT/ablation_${NAME:-ablation}.json"
    el "ablation"
    ;;
  D)
    build
    memdiag_start
    timeout 170 build-gpu/loongforge_tests \
      --gtest_filter='NvJpegDecoder.*:GpuLoaderTest.*:CkptCuda.*:CkptCufile*:MemCuda.*' \
      >"$OUT/ctest.log" 2>&1
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/ctest.log" | head -30; el "gtest"
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_data_gpu.py \
      tests/python/test_ckpt_cufile.py tests/python/test_ckpt.py tests/python/test_memory.py \
      >"$OUT/pytest.log" 2>&1
    tail -8 "$OUT/pytest.log"; el "pytest"
    memdiag_end
    timeout 200 "$PY" bench/loader/gpu_bench.py --out "$OUT" >"$OUT/loader_bench.log" 2>&1
    tail -45 "$OUT/loader_bench.log"; el "loader bench"
    ckpt_writers 130 90
    compile_row "${D_BUDGET:-585}" 100
    ;;
  E)
    build
    timeout 60 build-gpu/loongforge_tests --gtest_filter='CkptCufile*:CkptCuda.*' >"$OUT/ctest.log" 2>&1
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|rror" "$OUT/ctest.log" | head -20; el "gtest"
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_ckpt_cufile.py 2>&1 | tail -4
    ckpt_writers 150 60
    find . /tmp -maxdepth 3 -name cufile.log 2>/dev/null | head -3 | while read -r f; do
      echo "== $f"; tail -15 "$f"; done
    compile_row "${E_BUDGET:-300}" 110
    ;;
  F)
    build
    if [ "${F_TESTS:-1}" = 1 ]; then
      timeout 150 build-gpu/loongforge_tests --gtest_filter='NvJpegDecoder.*:GpuLoaderTest.*' \
        >"$OUT/ctest.log" 2>&1
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|\[nvjpeg\] turns" "$OUT/ctest.log" | head -20
      el "gtest"
      timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_data_gpu.py \
        >"$OUT/pytest.log" 2>&1
      tail -4 "$OUT/pytest.log"; el "pytest"
    fi
    timeout "${F_BENCH_T:-360}" "$PY" bench/loader/gpu_bench.py --out "$OUT" ${F_BENCH_ARGS:-} \
      >"$OUT/loader_bench.log" 2>&1
    grep -v "^{" "$OUT/loader_bench.log" | tail -70; el "loader bench"
    # F2_BENCH_ARGS: a second run in its own process (e.g. --cuda-schedule blocking --reuse-db).
    if [ -n "${F2_BENCH_ARGS:-}" ]; then
      mkdir -p "$OUT/run2"
      timeout "${F2_BENCH_T:-200}" "$PY" bench/loader/gpu_bench.py --out "$OUT/run2" \
        $F2_BENCH_ARGS >"$OUT/run2/loader_bench.log" 2>&1
      grep -v "^{" "$OUT/run2/loader_bench.log" | grep -v "^---" | tail -40; el "loader bench 2"
    fi
    ;;
  G)
    build
    memdiag_start
    timeout 150 build-gpu/loongforge_tests --gtest_filter='NvJpegDecoder.*:GpuLoaderTest.*' \
      >"$OUT/ctest.log" 2>&1
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|\[nvjpeg\] turns" "$OUT/ctest.log" | head -20
    el "gtest"
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_data_gpu.py \
      tests/python/test_graphs.py >"$OUT/pytest.log" 2>&1
    tail -6 "$OUT/pytest.log"; el "pytest"
    memdiag_end
    timeout "${G_BENCH_T:-300}" "$PY" bench/loader/gpu_bench.py --out "$OUT" >"$OUT/loader_bench.log" 2>&1
    grep -v "^{" "$OUT/loader_bench.log" | grep -v "^---" | tail -80; el "loader bench"
    ;;
  curves)
    build
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/python/test_graphs.py 2>&1 | tail -5
    el "test_graphs"
    timeout "${CURVES_T:-420}" bash bench/e2e/loss_curves.sh /tmp/lf_curves 2>&1 | tail -12
    tar czf "$OUT/curves.tgz" -C /tmp/lf_curves .
    el "curves"
    ;;
esac
