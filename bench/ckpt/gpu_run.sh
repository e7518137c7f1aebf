#!/usr/bin/env bash
# CheckpointVault on the GPU machine: the CUDA ckpt tests (C++ and Python) and the GPU benchmark
# (bench/ckpt/gpu_bench.py: 1.6B fp32 params on the device; vault save() blocking vs torch.save vs
# DCP async_save; fine-tune-like save with 40% frozen / 60% changed; restore; device_staging on and
# off side by side; segment writers posix and cufile side by side, see docs/ckpt.md). At most 4
# minutes (timeouts 45 + 45 + 150 s).
# Run from the repo root after bench/gpu_suite.sh built $BUILD (default build-gpu):
#   bash bench/ckpt/gpu_run.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: bash bench/ckpt/gpu_run.sh OUTDIR}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
PY=${PY:-python3}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
rc=0
echo "== CkptCuda + CkptCufile tests"
timeout 45 "$BUILD/loongforge_tests" --gtest_filter='CkptCuda.*:CkptCufile*' 2>&1 \
  | tee "$OUT/ckpt_cuda_tests.log" | tail -n 15 || rc=1
echo "== test_ckpt.py test_ckpt_cufile.py -k 'cuda or writer'"
timeout 45 $PY -m pytest -q -p no:cacheprovider tests/python/test_ckpt.py \
  tests/python/test_ckpt_cufile.py -k 'cuda or writer' 2>&1 \
  | tee "$OUT/ckpt_pytest.log" | tail -n 5 || rc=1
echo "== gpu_bench.py"
timeout 150 $PY bench/ckpt/gpu_bench.py --budget-s 90 --dir "${CKPT_BENCH_DIR:-/tmp/lf_ckpt_gpu}" \
  --out "$OUT/bench_ckpt_gpu.json" 2>&1 | tee "$OUT/bench_ckpt_gpu.log" || rc=1
exit $rc
