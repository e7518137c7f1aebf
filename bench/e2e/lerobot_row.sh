#!/usr/bin/env bash
# Issue 19's training row (one device call): n16 in loongforge mode at batch 16 on a packed LeRobot
# dataset (carried: bench/pack/lerobot_train_db.py --out .carry/lerobot_db, made where FFmpeg is)
# and on a demo dataset of the same shape (12 episodes of 60 rows, 2 cameras of 342x256, state 6,
# action 7), same flags. Then batch 64 on the e2e DB with a checkpoint at step 300 (the save's
# blocking time). RUN_TESTS=1 first runs the GPU tests of this change.
set -uo pipefail
source bench/gpu_env.sh
gpu_build
if [ "${RUN_TESTS:-0}" = 1 ]; then
  (cd build-gpu && timeout 120 ctest -R 'CkptCuda|RecordStore' --timeout 100 --output-on-failure) \
    >"$OUT/ctest.log" 2>&1
  grep -E "tests passed|Failed" "$OUT/ctest.log"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfs tests/python/test_train.py -k gpu \
    >"$OUT/pytest.log" 2>&1
  tail -n 3 "$OUT/pytest.log"
fi
cli=build-gpu/loongforge
"$cli" demo-data --out /tmp/lf_demo_342 --episodes 12 --cameras 2 --size 342x256 --steps-min 60 \
  --steps-max 60 --state-dim 6 --action-dim 7 --quiet --overwrite >/dev/null
"$cli" pack --src /tmp/lf_demo_342 --out /tmp/lf_demo_342_db --overwrite --quiet >/dev/null
row() {  # name db batch steps ckpt_every
  timeout 200 python3 bench/e2e/run.py --db "$2" --config n16 --batches "$3" --modes loongforge \
    --steps "$4" --warmup 10 --ckpt-every "$5" --workers 16 --loader-threads 12 --out "/tmp/e2e_$1" \
    >"$OUT/e2e_$1.log" 2>&1
  grep -E "tokens/GPU/s|data wait|ckpt blocking" "$OUT/e2e_$1.log" | sed "s/^/$1: /"
  echo "$1 done $(($(date +%s) - t0)) s"
}
row lerobot .carry/lerobot_db 16 150 0
row demo /tmp/lf_demo_342_db 16 150 0
if [ "${B64:-1}" = 1 ]; then
  row b64 "$(bash bench/e2e/make_db.sh "$cli" 2>/dev/null)" 64 320 300
  python3 -c "
import json; d=json.load(open('/tmp/e2e_b64/loongforge_b64.json'))
print(d['figures'].get('ckpt_per_save'))"
fi
