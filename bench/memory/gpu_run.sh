#!/usr/bin/env bash
# MemSculptor on the GPU machine. Run from the repo root after building into build-gpu/ (the
# GPU suite, bench/gpu_suite.sh, runs every bench/*/gpu_run.sh so, with PYTHONPATH=python); $1 = output directory.
# Budget: about 8 minutes in all; every part has its own timeout, a failed part does not stop the
# next ones, and the exit status is non-zero if any part failed.
#   1. C++ tests   ./build-gpu/loongforge_tests --gtest_filter='Mem*'   (MemCuda.* run on the device)
#   2. Python      pytest tests/python/test_memory.py                   (the allocator under torch)
#   3. traces      bench/memory/capture_traces.py -> $1/traces          (real traces: GR00T n16 steps
#                  with variable-length text, one n16-moe MoE layer; torch snapshot + MemSculptor)
#   4. replay      bench/memory/replay_traces.py over $1/traces/*.trace.zst -> $1/replay_traces.json
#   5. benchmark   bench/memory/gpu_bench.py --all -> $1/bench_memory_gpu.json
#                  (torch default vs expandable_segments vs MemSculptor: peaks, fragmentation,
#                  step time, largest batch under a 6 GiB cap)
set -uo pipefail
out=${1:-results/gpu}
mkdir -p "$out/traces"
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

timeout 35 "$PY" -m pytest -q tests/python/test_memory.py tests/python/test_replay_traces.py \
  >"$out/memory_pytest.log" 2>&1
r=$?; tail -n 2 "$out/memory_pytest.log"; [ $r -eq 0 ] || fail "pytest test_memory.py" $r

# Four capture processes (90 s timeout each; about 30-45 s each expected), n16 -> small fallback.
timeout 330 "$PY" bench/memory/capture_traces.py --out "$out/traces" 2>&1 | tee "$out/capture.log"
r=${PIPESTATUS[0]}; [ $r -eq 0 ] || fail "capture_traces.py" $r

# CPU replay of what was captured (the same report runs later on any machine over bench/traces/).
cli=build-gpu/loongforge; [ -x "$cli" ] || cli=build/loongforge
if ls "$out"/traces/*.trace* >/dev/null 2>&1; then
  timeout 120 "$PY" bench/memory/replay_traces.py --cli "$cli" --json "$out/replay_traces.json" \
    $(ls "$out"/traces/*.trace.zst "$out"/traces/*.trace 2>/dev/null) 2>&1 | tee "$out/replay.log"
  r=${PIPESTATUS[0]}; [ $r -eq 0 ] || fail "replay_traces.py" $r
else
  fail "replay_traces.py (no traces captured)" 1
fi

# Six processes: loop and batch search per allocator (75 s timeout each, ~20-30 s expected).
timeout 240 "$PY" bench/memory/gpu_bench.py --all --json "$out/bench_memory_gpu.json"
r=$?; [ $r -eq 0 ] || fail "gpu_bench.py" $r
# gpu_bench.py reports a failed mode in its table and JSON but exits 0: count it as a failure here.
if [ -f "$out/bench_memory_gpu.json" ]; then
  "$PY" -c 'import json,sys; rows=json.load(open(sys.argv[1]))["results"]; bad=[r["mode"]+"/"+r["phase"] for r in rows if "error" in r]; print("memory gpu_run: failed:", bad) if bad else None; sys.exit(1 if bad else 0)' "$out/bench_memory_gpu.json" || rc=1
fi
exit $rc
