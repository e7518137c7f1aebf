#!/usr/bin/env bash
# Runs every libFuzzer target of the fuzz build for SECONDS each (default 25: six targets, under
# three minutes), starting from the committed seed corpus, and fails on any finding. Prints execs
# and coverage per target. A crashing input is left in fuzz/regressions/pending/<target>/.
# Usage: tools/run_fuzzers.sh [SECONDS]   (env BUILD_FUZZ: the fuzz build dir, default build-fuzz;
#        it is configured and built here when missing)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_EACH=${1:-25}
BUILD=${BUILD_FUZZ:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
TARGETS=(fuzz_manifest fuzz_schema fuzz_lmdb fuzz_parquet fuzz_lerobot_meta fuzz_jpeg)
max_len() {
  case $1 in
    fuzz_lmdb | fuzz_parquet) echo 32768 ;;  # the seeds are a real data.mdb / Parquet files
    *) echo 8192 ;;
  esac
}

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOONGFORGE_CUDA=OFF -DLOONGFORGE_PYTHON=OFF \
    -DLOONGFORGE_TESTS=OFF -DLOONGFORGE_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 \
    -DCMAKE_CXX_COMPILER=clang++-14 "${launcher[@]}" >/dev/null || exit 1
fi
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >/dev/null || exit 1

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$ROOT/fuzz/lsan.supp"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
printf '%-20s %10s %8s %8s  %s\n' target execs cov ft result
for t in "${TARGETS[@]}"; do
  pending=$ROOT/fuzz/regressions/pending/$t
  mkdir -p "$work/$t" "$pending"
  # New inputs go to a scratch corpus; the committed seeds stay as they are.
  "$BUILD/fuzz/$t" "$work/$t" "$ROOT/fuzz/corpus/$t" -max_total_time="$SECONDS_EACH" -seed="${FUZZ_SEED:-1}" \
    -max_len="$(max_len "$t")" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$pending/" >"$work/$t.log" 2>&1 </dev/null
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$work/$t.log" | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$work/$t.log" | tail -1 | grep -o '[0-9]*')
  if [ $rc -eq 0 ]; then
    result=ok
  else
    result="FINDING (rc $rc): $(ls -t "$pending" | head -1)"
    failed+=("$t")
  fi
  printf '%-20s %10s %8s %8s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$result"
  if [ $rc -ne 0 ]; then
    # The sanitizer's verdict and the project's top frames (file:line); the full log is above it.
    grep -E -m1 'ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error|terminate called|ERROR: libFuzzer' \
      "$work/$t.log" | cut -c1-200 | sed 's/^/    /'
    grep -E '^ *#[0-9]+ ' "$work/$t.log" | grep -oE '(src|fuzz)/[A-Za-z0-9_./]+\.(cc|h):[0-9]+' | head -4 |
      sed 's/^/      at /'
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run_fuzzers: findings in: ${failed[*]} (inputs under fuzz/regressions/pending/)" >&2
  exit 1
fi
echo "run_fuzzers: no findings (${SECONDS_EACH}s per target)"
