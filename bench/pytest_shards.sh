#!/usr/bin/env bash
# pytest in SHARDS processes side by side on the GPU machine (the H200 and its 16 cores have room
# for six), the collected tests dealt out one by one. Tests, not files: test_train.py's GPU
# trainer runs alone outlast a shard of other files (run N1: 34 of its 40 tests in 450 s, each
# compiling its blocks); dealt one by one, every file's slow tests are spread over the shards.
#   bash bench/pytest_shards.sh SHARDS TIMEOUT_S LOGPREFIX PATHS...
# Writes LOGPREFIX<k>.log per shard, prints each shard's result lines, and exits 0 only when every
# shard passed (a shard cut by TIMEOUT_S says so).
set -uo pipefail
shards=${1:?usage: pytest_shards.sh SHARDS TIMEOUT_S LOGPREFIX PATHS...}
t=${2:?timeout} prefix=${3:?log prefix}
shift 3
PY=${PY:-python3}
# node ids, each once (a warnings summary may repeat some)
mapfile -t ids < <("$PY" -m pytest -q -p no:cacheprovider --collect-only "$@" 2>/dev/null |
  awk '/::/ && !/^[[:space:]]/ && !seen[$0]++')
[ ${#ids[@]} -gt 0 ] || ids=("$@")  # collection failed: one shard runs the paths and says why
pids=()
for ((k = 0; k < shards; k++)); do
  mine=()
  for ((i = k; i < ${#ids[@]}; i += shards)); do mine+=("${ids[i]}"); done
  [ ${#mine[@]} -gt 0 ] || break
  timeout "$t" "$PY" -m pytest -q -p no:cacheprovider -rfs "${mine[@]}" >"$prefix$k.log" 2>&1 &
  pids+=($!)
done
rc=0
for k in "${!pids[@]}"; do
  wait "${pids[k]}"
  r=$?
  if [ "$r" -eq 124 ]; then  # pytest printed no summary: its progress line is the record
    n=$(grep -oE '^[.sFExX]+' "$prefix$k.log" | tr -d '\n' | wc -c)
    echo "shard $k: cut after $t s, $n tests reported"
  fi
  [ "$r" -eq 0 ] || rc=1
  grep -E "passed|failed|FAILED|Error" "$prefix$k.log" | tail -12
done
exit $rc
