#!/usr/bin/env bash
# NexusSync on the GPU machine (called by bench/gpu_suite.sh from the repo root; $1 = output dir).
set -uo pipefail
out=${1:-results/gpu}
mkdir -p "$out"
PY=${PY:-python3}
[ -x build-gpu/loongforge_tests ] && ./build-gpu/loongforge_tests --gtest_filter='Comm*' 2>&1 | tail -5
timeout 240 $PY bench/comm/gpu_bench.py --out "$out/bench_comm_gpu.json"
