#!/usr/bin/env bash
# Diagnosis of the batch-64 data wait on the GPU machine (one device call): builds, runs the
# CheckpointVault CUDA tests, then n16 loongforge runs at batch 64 under bench/e2e/stall_probe.py
# (torch profiler over 4 steps) and summarizes the trace. Results under $OUT.
set -uo pipefail
source bench/gpu_env.sh
# shellcheck disable=SC2086  # DIAG_TARGETS is a list of targets
gpu_build ${DIAG_TARGETS:-}
if [ "${DIAG_CTEST:-CkptCuda}" != none ]; then
  (cd build-gpu && timeout 120 ctest -R "${DIAG_CTEST:-CkptCuda}" --output-on-failure) >/tmp/ctest.log 2>&1
  grep -E "tests passed|Failed|FAILED|Expected|Which is|rror|\.cc:[0-9]+" /tmp/ctest.log | head -40 >/tmp/ctest_sum.txt
fi
db=$(bash bench/e2e/make_db.sh build-gpu/loongforge 2>/dev/null)
echo "db $(($(date +%s) - t0)) s"
common=(--config n16 --data "$db" --mode loongforge --workers 16 --loader-threads 12 --warmup 10 --log-every 5)
for row in ${DIAG_ROWS:-b64 b64p12}; do
  extra=()
  bs=64
  steps=${DIAG_STEPS:-34}
  case $row in
    b64p12) extra=(--prefetch 12) ;;
    b64c32) export CUDA_DEVICE_MAX_CONNECTIONS=32 ;;
    b64cg) extra=(--cuda-graph off) ;;
    b16) bs=16 ;;
    b128) bs=128 ;;
  esac
  [ "$row" = b64c32 ] || unset CUDA_DEVICE_MAX_CONNECTIONS
  PROBE_START=24 PROBE_STOP=28 PROBE_OUT="/tmp/trace_$row.json" timeout "${DIAG_T:-200}" \
    python3 bench/e2e/stall_probe.py "${common[@]}" --batch-size $bs --steps "$steps" "${extra[@]}" \
    --metrics-jsonl "/tmp/$row.jsonl" --json-out "$OUT/$row.json" >"/tmp/$row.log" 2>&1
  echo "=== $row rc=$? $(($(date +%s) - t0)) s"
  python3 - "/tmp/$row.jsonl" "$OUT/$row.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("wait ms per step:", " ".join(f"{r['data_wait_s'] * 1e3:.0f}" for r in rows[:60]))
print("step ms per step:", " ".join(f"{r['step_s'] * 1e3:.0f}" for r in rows[:60]))
w = [r["data_wait_s"] for r in rows[10:]]
print(f"after warm-up: {len(w)} steps, wait > 5 ms in {sum(x > 0.005 for x in w)}, max {max(w) * 1e3:.0f} ms")
s = json.load(open(sys.argv[2]))
f = s.get("figures", {})
print({k: f.get(k) for k in ("step_ms_p50", "step_ms_p95", "tokens_per_gpu_per_s", "data_wait_share")})
ld = s.get("loader_metrics") or {}
dev = ld.get("device", {})
print({k: dev.get(k) for k in ("decode_host_ms_per_batch", "decoded_batches")})
h = ld.get("histograms", {})
print({k: {q: round(v.get(q, 0), 2) for q in ("p50", "p95", "max")} for k, v in h.items() if "wait" in k or "latency" in k})
PY
  [ -f "/tmp/trace_$row.json" ] && python3 bench/e2e/trace_summary.py "/tmp/trace_$row.json" --top 12 --streams 4
done
[ -f /tmp/ctest_sum.txt ] && cat /tmp/ctest_sum.txt
echo "total $(($(date +%s) - t0)) s"
