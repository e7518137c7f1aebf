#!/usr/bin/env bash
# MemSculptor on the GPU machine. Run from the repo root after building into build-gpu/ (the lead's
# GPU suite runs every bench/*/gpu_run.sh so, with PYTHONPATH=python); $1 = output directory.
# Budget: under 3 minutes in all; every part has its own timeout, a failed part does not stop the
# next ones, and the exit status is non-zero if any part failed.
#   1. C++ tests   ./build-gpu/loongforge_tests --gtest_filter='Mem*'   (MemCuda.* run on the device)
#   2. Python      pytest tests/python/test_memory.py                   (the allocator under torch)
#   3. benchmark   bench/memory/gpu_bench.py --all  -> $1/bench_memory_gpu.json
set -uo pipefail
out=${1:-results/gpu}
mkdir -p "$out"
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-python}
rc=0
fail() { echo "memory gpu_run: $1 failed (rc $2)"; rc=1; }

if [ -x build-gpu/loongforge_tests ]; then
  timeout 25 ./build-gpu/loongforge_tests --gtest_filter='Mem*' >"$out/memory_gtest.log" 2>&1
  r=$?; tail -n 3 "$out/memory_gtest.log"; [ $r -eq 0 ] || fail "gtest Mem*" $r
else
  echo "memory gpu_run: build-gpu/loongforge_tests not found, C++ tests skipped"
fi

timeout 35 "$PY" -m pytest -q tests/python/test_memory.py >"$out/memory_pytest.log" 2>&1
r=$?; tail -n 2 "$out/memory_pytest.log"; [ $r -eq 0 ] || fail "pytest test_memory.py" $r

# torch default vs expandable_segments vs MemSculptor, each in its own process (about 30 s each:
# torch start-up, then 90 steps of a 12-layer d=2048 transformer; fewer steps than the documented
# 40 + 100 to fit the budget).
timeout 115 "$PY" bench/memory/gpu_bench.py --all --warmup 30 --steps 60 \
  --json "$out/bench_memory_gpu.json"
r=$?; [ $r -eq 0 ] || fail "gpu_bench.py" $r
# gpu_bench.py reports a failed mode in its table and JSON but exits 0: count it as a failure here.
if [ -f "$out/bench_memory_gpu.json" ]; then
  "$PY" -c 'import json,sys; rows=json.load(open(sys.argv[1]))["results"]; bad=[r["mode"] for r in rows if "error" in r]; print("memory gpu_run: failed modes:", bad) if bad else None; sys.exit(1 if bad else 0)' "$out/bench_memory_gpu.json" || rc=1
fi
exit $rc
