#!/usr/bin/env bash
# Issue 16's memory rows and issue 18's MoE rows, one device call. Parts are chosen by PARTS
# (space-separated, default "tests gemm mem moe16 moe64"):
#   tests  the GPU tests of TEST_FILES (tests/python/test_graphs.py; PYTEST_K selects), and the
#          ctest tests matching CTEST_R when set
#   gemm   bench/moe/grouped_gemm.py
#   mem    n16 in MEM_MODES (tuned,loongforge) at MEM_BATCHES (16,64) for MEM_STEPS (80), no
#          checkpoints: peak allocated / reserved; MEM_EXTRA: one more run.py flag, e.g.
#          "--extra=--init-device device"
#   moe16, moe64  n16-moe at batch 16 / 64 in MOE_MODES (baseline,tuned,loongforge)
#   hist   HIST_CONFIG (n16) at batch HIST_B (16) in MEM_MODES with --memory-history: what is live
#          at the peak, by allocation site, and the reserved peak's free bytes by pool
#          (bench/memory/peak_breakdown.py); HIST_EXTRA: further trainer flags, e.g.
#          "--memory-cap-gib 40" with HIST_B=56 for the capped batch that did not fit (run J4;
#          the snapshot is dumped at the out-of-memory too)
#   prof   n16 loongforge at PROF_BATCHES (16,64) with --profile-modules 5: where the eager step's
#          time goes, by part (issue 17)
#   profc  prof's profile of the compiled blocks (--compile-blocks on --token-pad 56: the profile's
#          eager steps get static shapes, so each block kind compiles once)
#   fp8    n16 loongforge at batch 64 with --fp8-frozen (compare with mem's bf16 row)
#   proffp8  prof's profile of the --fp8-frozen step at batch 64
#   maxb   bench/memory/max_batch.py: the largest n16 batch under a MAXB_CAP (40) GiB cap in
#          tuned, tuned+expandable and loongforge, side by side (--parallel), from MAXB_START (32),
#          a fitting batch times MAXB_GROWTH (2) next;
#          MAXB_EXTRA: further flags, e.g. "--extra=--init-device --extra=device"
#   cf     n16 loongforge at CF_BATCHES (64) with --compile-frozen (issue 17)
#   hx     HX_RUNS side by side with --memory-history: peak allocated / reserved and the reserved
#          peak's free bytes by pool, per run (see the part for the format)
# FAST_INIT=1: prof and fp8 build the model on the GPU (--init-device device; speed rows only, the
# memory rows keep the host init).
# ROW_T bounds each bench/e2e/run.py call (and each hist run), in seconds.
#   PARTS="tests gemm mem moe16" bash bench/e2e/mem_moe_rows.sh
set -uo pipefail
source bench/gpu_env.sh
gpu_build
parts=" ${PARTS:-tests gemm mem moe16 moe64} "
has() { [[ "$parts" == *" $1 "* ]]; }
tests_part() {
  timeout "${TESTS_T:-150}" python3 -m pytest -q -p no:cacheprovider -rfs ${TEST_FILES:-tests/python/test_graphs.py} \
    ${PYTEST_K:+-k "$PYTEST_K"} >"$OUT/pytest_graphs.log" 2>&1
  tail -n 4 "$OUT/pytest_graphs.log"
  if [ -n "${CTEST_R:-}" ]; then
    (cd build-gpu && timeout 120 ctest --output-on-failure -R "$CTEST_R") >"$OUT/ctest_parts.log" 2>&1
    grep -E "tests passed|\(Failed\)" "$OUT/ctest_parts.log"
  fi
  echo "tests $(($(date +%s) - t0)) s"
}
tests_pid=
if has tests; then
  # TESTS_BG=1: the tests run beside the parts below (their models are tiny) until mem/prof
  if [ -n "${TESTS_BG:-}" ]; then tests_part & tests_pid=$!; else tests_part; fi
fi
if has gemm; then
  timeout 150 python3 bench/moe/grouped_gemm.py >"$OUT/grouped_gemm.json" 2>"$OUT/grouped_gemm.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['backend'], [(r['tokens'], round(r['fwd_ratio'],3), round(r['fwdbwd_ratio'],3)) for r in d['rows']])" "$OUT/grouped_gemm.json"
  echo "gemm $(($(date +%s) - t0)) s"
fi
db=$(bash bench/e2e/make_db.sh build-gpu/loongforge)
if has hx; then
  # HX_RUNS: runs side by side, HX_PAR (3) at a time (memory figures only: they share the GPU and
  # its cores), each "label|mode|batch|env assignments|trainer flags", separated by ';', all with
  # --memory-history and --init-device device, HX_STEPS (16) steps; then peak_breakdown of each.
  # Logs and breakdowns come back in one archive, $OUT/hx.tgz (a call returns few files).
  IFS=';' read -ra hx_runs <<<"${HX_RUNS:-}"
  hx=/tmp/hx; mkdir -p $hx; hx_pids=()
  for spec in "${hx_runs[@]}"; do
    IFS='|' read -r lab m b envs flags <<<"$spec"
    while :; do  # at most HX_PAR of these runs at a time (the tests may run beside them)
      n=0; for q in ${hx_pids[@]+"${hx_pids[@]}"}; do kill -0 "$q" 2>/dev/null && n=$((n + 1)); done
      [ "$n" -lt "${HX_PAR:-3}" ] && break; sleep 1
    done
    ( timeout "${ROW_T:-330}" env $envs python3 -m loongforge.train --config n16 --data "$db" \
        --mode "$m" --steps "${HX_STEPS:-16}" --warmup 4 --batch-size "$b" --workers 4 \
        --loader-threads 4 --augment groot --ckpt-every 0 --log-every 4 --init-device device \
        --memory-history "$hx/$lab.pickle" $flags >"$hx/$lab.log" 2>&1
      rc=$?
      echo "== hx $lab ($(($(date +%s) - t0)) s): rc $rc $(grep -m1 -E 'peak (alloc|mem)' "$hx/$lab.log")"
      grep -m2 -iE "out of memory|error" "$hx/$lab.log" | cut -c1-400
      [ -f "$hx/$lab.pickle" ] && python3 bench/memory/peak_breakdown.py "$hx/$lab.pickle" --top 8 \
        --json "$hx/$lab.json" >"$hx/$lab.txt" 2>&1 ) &
    hx_pids+=($!)
  done
  wait ${hx_pids[@]+"${hx_pids[@]}"}
  for spec in "${hx_runs[@]}"; do
    lab=${spec%%|*}
    [ -f "$hx/$lab.txt" ] && grep -vE "^ +[0-9.]+ GiB +[0-9]+ blocks" "$hx/$lab.txt" | head -12
  done
  (cd $hx && tar czf "$OUT/hx.tgz" *.log *.txt *.json 2>/dev/null)
  echo "hx done $(($(date +%s) - t0)) s"
fi
if has maxb; then
  timeout $((${MAXB_T:-420} + 60)) python3 bench/memory/max_batch.py --db "$db" --config n16 \
    --cap-gib "${MAXB_CAP:-40}" --parallel --start "${MAXB_START:-32}" --workers 4 \
    --growth "${MAXB_GROWTH:-2}" \
    --budget-s "${MAXB_T:-420}" \
    --loader-threads 4 --out /tmp/maxb ${MAXB_EXTRA:-} >"$OUT/max_batch.log" 2>&1
  echo "== maxb: rc $?"
  cp /tmp/maxb/max_batch.json "$OUT/" 2>/dev/null
  tail -n 20 "$OUT/max_batch.log"
  echo "maxb done $(($(date +%s) - t0)) s"
fi
rows() {  # name config batches modes steps [more run.py flags]
  timeout "${ROW_T:-330}" python3 bench/e2e/run.py --db "$db" --config "$2" --batches "$3" \
    --modes "$4" --steps "$5" --warmup 10 --ckpt-every 0 --workers 16 --loader-threads 12 \
    --out "/tmp/e2e_$1" "${@:6}" >"$OUT/e2e_$1.log" 2>&1
  echo "== $1: rc $?"
  grep -A12 -E "^$2, batch" "$OUT/e2e_$1.log" | grep -vE "^\s*$" | head -40
  echo "$1 done $(($(date +%s) - t0)) s"
}
[ -n "$tests_pid" ] && wait "$tests_pid"
has mem && rows mem n16 "${MEM_BATCHES:-16,64}" "${MEM_MODES:-tuned,loongforge}" "${MEM_STEPS:-80}" \
  ${MEM_EXTRA:+"$MEM_EXTRA"}
has cf && rows cf n16 "${CF_BATCHES:-64}" loongforge 40 \
  --extra="--compile-frozen${FAST_INIT:+ --init-device device}"
has prof && rows prof n16 "${PROF_BATCHES:-16,64}" loongforge 30 --profile-modules 5 \
  ${FAST_INIT:+"--extra=--init-device device"}
has profc && rows profc n16 "${PROF_BATCHES:-16,64}" loongforge 30 --profile-modules 5 \
  --extra="--compile-blocks on --token-pad 56${FAST_INIT:+ --init-device device}"
has fp8 && rows fp8 n16 64 loongforge 40 --extra="--fp8-frozen${FAST_INIT:+ --init-device device}"
has proffp8 && rows proffp8 n16 64 loongforge 30 --profile-modules 5 \
  --extra="--fp8-frozen${FAST_INIT:+ --init-device device}"
if has hist; then
  snaps=()
  for m in ${MEM_MODES//,/ }; do
    timeout "${ROW_T:-330}" python3 -m loongforge.train --config "${HIST_CONFIG:-n16}" --data "$db" --mode "$m" \
      --steps 24 --warmup 4 --batch-size "${HIST_B:-16}" --workers 16 --loader-threads 12 \
      --augment groot --ckpt-every 0 --log-every 8 --memory-history "/tmp/hist_$m.pickle" \
      ${HIST_EXTRA:-} >"$OUT/hist_$m.log" 2>&1
    echo "== hist $m: rc $? $(grep -m1 -E 'peak (alloc|mem)' "$OUT/hist_$m.log")"
    snaps+=("/tmp/hist_$m.pickle")
  done
  python3 bench/memory/peak_breakdown.py "${snaps[@]}" --json "$OUT/peak_breakdown.json" \
    | tee "$OUT/peak_breakdown.txt"
  echo "hist done $(($(date +%s) - t0)) s"
fi
has moe16 && rows moe16 n16-moe 16 "${MOE_MODES:-baseline,tuned,loongforge}" 40
has moe64 && rows moe64 n16-moe 64 "${MOE_MODES:-baseline,tuned,loongforge}" 30
echo "total $(($(date +%s) - t0)) s"
