#!/usr/bin/env bash
# Which switch makes n16 b16 go non-finite after ~100 steps (diagnostic; $1 = output dir).
out=${1:-/tmp}
eval "$(bash tools/gpu-deps.sh unpack)" >/dev/null 2>&1
export PYTHONPATH=$PWD/python
db=$(bash bench/e2e/make_db.sh build-gpu/loongforge)
run() {  # name env... -- args...
  local name=$1; shift
  env "$@" python3 -m loongforge.train --config n16 --data $db --mode loongforge --batch-size 16 \
    --steps ${NSTEPS:-125} --warmup 5 --loader-threads 12 --quiet --json-out /tmp/nan_$name.json \
    ${ARGS[@]} >/tmp/nan_$name.log 2>&1
  python3 -c "
import json,math,sys
s=json.load(open('/tmp/nan_$name.json')); lc=[r['loss'] for r in s['loss_curve']]
bad=[i+1 for i,x in enumerate(lc) if not math.isfinite(x)]
print('$name', 'first non-finite step', bad[0] if bad else None, 'p50', round(s['figures']['step_ms_p50'],1), 'last', lc[-1])" || tail -5 /tmp/nan_$name.log
}
ARGS=(--token-buckets 64 --adamw fused); run v1_graphs_fused_trainerpad LOONGFORGE_TRAIN_LOADER_BUCKETS=0
ARGS=(--token-buckets 64 --adamw fused --cuda-graph off); run v3_eager_fused_loaderpad X=1
