#!/usr/bin/env bash
# Which earlier test, run in the same process, makes TARGET fail? pytest runs "CANDIDATE TARGET"
# for each candidate side by side (at most JOBS at once), and once all candidates in the given
# order followed by TARGET (the order a shard ran them in, to check that the failure reproduces).
# Each run is under CUDA_LAUNCH_BLOCKING=1, so a kernel's fault is reported by the test that
# launched it rather than by a later one.
#   bash bench/pytest_culprit.sh LOGDIR TARGET CANDIDATE...
# Prints one line per run: TARGET's outcome (passed, failed, or no result: the process died) and,
# when it did not pass, the first error line of the run.
set -uo pipefail
dir=${1:?usage: pytest_culprit.sh LOGDIR TARGET CANDIDATE...}
target=${2:?target test id}
shift 2
PY=${PY:-python3}
JOBS=${JOBS:-6}
T=${T:-300}
mkdir -p "$dir"

outcome() {  # outcome LOG: TARGET's result line in the log's -rA summary
  local w
  for w in PASSED FAILED ERROR; do
    grep -qF "$w $target" "$1" && { echo "$w"; return; }
  done
  echo no-result
}

run() {  # run NAME IDS...
  local name=$1
  shift
  CUDA_LAUNCH_BLOCKING=1 timeout "$T" "$PY" -m pytest -q -p no:cacheprovider -rA "$@" "$target" \
    >"$dir/$name.log" 2>&1
}

run all "$@" &
i=0
for c in "$@"; do
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  run "c$i" "$c" &
done
wait
report() {  # report NAME WHAT
  local o
  o=$(outcome "$dir/$1.log")
  printf '%-10s %-8s %s\n' "$o" "$1" "$2"
  [ "$o" = PASSED ] ||
    grep -m2 -E "Error|error:|Aborted|core dumped|Fatal" "$dir/$1.log" | cut -c1-240 | sed 's/^/    /'
}
report all "all $# candidates in order"
i=0
for c in "$@"; do
  i=$((i + 1))
  report "c$i" "$c"
done
