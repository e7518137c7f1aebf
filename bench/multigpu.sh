#!/usr/bin/env bash
# Multi-GPU runs for NexusSync and the end-to-end comparison (issue 8; docs/bench_multigpu.md).
#
#   bash bench/multigpu.sh [OUT_DIR]        # from anywhere; OUT_DIR default results/multigpu
#
# Counts GPUs with `nvidia-smi -L`:
#   >= 2 GPUs (NCCL, NVLink multicast off): (a) all-reduce busbw sweep 1 MB..1 GB, NexusSync vs
#     torch.distributed, at every world in 2 4 8 that fits; (b) NexusSync vs DDP on the harness
#     model and on the trainer's n16 / n16-moe policies (synthetic batches; top-k off/on), and
#     end to end through `python -m loongforge.train` (loongforge mode with / without NexusSync);
#     (c) the trainer's three modes at 1 GPU and at the largest world (tokens/GPU/s, scaling
#     efficiency); (d) kill one rank mid-step.
#   0 or 1 GPU: the same harness on Gloo with 4 and 8 CPU processes (1..64 MB, a small model).
# Needs the loongforge._C module built (python/loongforge/_C*.so) and, for (b)/(c) with the
# trainer, the `loongforge` CLI (for demo-data + pack) in build-gpu/ or build/.
# Every step runs under `timeout`; a summary table is printed last; JSON lands in OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-results/multigpu}}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
H=bench/multigpu/harness.py
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
NGPU=${NGPU:-0}
summary=()
step() {  # step NAME TIMEOUT_S CMD...  (log in OUT/NAME.log)
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  echo "== $name: $*"
  timeout -k 10 "$t" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-34s rc=%-3s %5ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  return $rc
}
# W ranks of "$PY ARGS..." with the env torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*):
# no torchrun needed (Debian's torch 1.13 torchrun fails on Python 3.11). Under `step`, timeout
# signals the whole process group, so the ranks go with it.
dist_run() {
  local w=$1; shift
  local port=$(( 20000 + RANDOM % 20000 )) pids=() rc=0 r p
  for ((r = 0; r < w; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$w LOCAL_WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port $PY "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}
export -f dist_run
export PY
{ echo "date: $(date -u '+%F %T UTC')"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null)";
  echo "gpus: $NGPU"; nvidia-smi -L 2>/dev/null; echo "cpus: $(nproc)"; } | tee "$OUT/machine.txt"

if [ "$NGPU" -lt 2 ]; then
  echo "CPU mode ($NGPU GPU): Gloo, 4 and 8 processes on $(nproc) cores"
  step cpu_suite 290 $PY $H suite --profile cpu --worlds 4 8 --out "$OUT/cpu.json"
  # The trainer's policy (tiny, 4 experts) with synthetic batches: NexusSync vs DDP, top-k on/off.
  step cpu_gr00t_tiny_moe_w4 120 $PY $H train --profile cpu --world 4 --model gr00t:tiny \
    --image-size 56 --moe-experts 4 --seq 16 --batch 2 --steps 4 --warmup 1 --out "$OUT/cpu_gr00t_w4.json"
  echo; echo "== summary =="; printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
  exit 0
fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# Selection, so that each piece fits one 10-minute call: PARTS (default all of
# "sweep kill train gr00t trainer e2e"), WORLDS (default "2 4 8", capped at the GPU count).
PARTS=" ${PARTS:-sweep kill train gr00t trainer e2e} "
WORLDS_ALL=(); for w in ${WORLDS:-2 4 8}; do [ "$w" -le "$NGPU" ] && WORLDS_ALL+=("$w"); done
has() { [[ "$PARTS" == *" $1 "* ]]; }
echo "GPU mode: $NGPU GPUs, worlds ${WORLDS_ALL[*]}, parts${PARTS% }"

for w in "${WORLDS_ALL[@]}"; do
  # (a) bus bandwidth 1 MB..1 GB, NexusSync's flat-bucket path vs dist.all_reduce.
  has sweep && step "sweep_w$w" 400 $PY $H sweep --profile gpu --world "$w" --out "$OUT/sweep_w$w.json"
  # (d) SIGKILL one rank mid-step; every other rank must exit with an error within the timeout.
  has kill && step "kill_w$w" 300 $PY $H kill --profile gpu --world "$w" --timeout-s 30 \
    --deadline-s 200 --out "$OUT/kill_w$w.json"
  # (b) NexusSync vs DDP on the harness model (140 M params, 8 experts).
  has train && step "harness_train_w$w" 400 $PY $H train --profile gpu --world "$w" \
    --out "$OUT/train_w$w.json"
  # (b) the trainer's n16 / n16-moe policies on synthetic batches (no data pipeline in the way):
  # step time, exposed communication, overlap, bytes per group with top-k off/on.
  if has gr00t; then
    for cfg in n16 n16-moe; do
      step "gr00t_${cfg}_w$w" 600 $PY $H train --profile gpu --world "$w" --model "gr00t:$cfg" \
        --batch 8 --seq 64 --steps 10 --warmup 3 --deadline-s 560 --out "$OUT/gr00t_${cfg}_w$w.json"
    done
  fi
done

# (b) and (c) through the trainer (`python -m loongforge.train`) on a packed demo DB.
if (has trainer || has e2e) && $PY -c "import loongforge.train" 2>/dev/null; then
  CLI=$(ls build-gpu/loongforge build/loongforge 2>/dev/null | head -1)
  DB=$OUT/demo.lmdb
  if [ ! -e "$DB/data.mdb" ] && [ -n "$CLI" ]; then
    step demo_data 600 "$CLI" demo-data --out "$OUT/demo" --episodes 64 --cameras 2 --size 640x480
    step pack 600 "$CLI" pack --src "$OUT/demo" --out "$DB"
  fi
  if [ -e "$DB/data.mdb" ]; then
    STEPS=${STEPS:-30} BATCH=${BATCH:-16}
    TR="-m loongforge.train --data $DB --steps $STEPS --batch-size $BATCH --warmup 5 --workers 8 --loader-threads 8 --quiet"
    if has trainer; then  # loongforge mode with NexusSync vs with DDP (--no-nexussync)
      for cfg in n16 n16-moe; do
        for w in "${WORLDS_ALL[@]}"; do
          step "trainer_${cfg}_w${w}_nexus" 600 bash -c 'dist_run "$@"' _ "$w" $TR \
            --config "$cfg" --mode loongforge --json-out "$OUT/trainer_${cfg}_w${w}_nexus.json"
          step "trainer_${cfg}_w${w}_ddp" 600 bash -c 'dist_run "$@"' _ "$w" $TR \
            --config "$cfg" --mode loongforge --no-nexussync --json-out "$OUT/trainer_${cfg}_w${w}_ddp.json"
        done
      done
    fi
    if has e2e; then  # every mode the trainer has, at 1 GPU and at the largest world
      MODES="baseline loongforge"
      $PY -m loongforge.train --help 2>/dev/null | grep -q "baseline,tuned" && MODES="baseline tuned loongforge"
      WMAX=${WORLDS_ALL[-1]}
      for mode in $MODES; do
        for w in 1 "$WMAX"; do
          step "e2e_${mode}_w${w}" 600 bash -c 'dist_run "$@"' _ "$w" $TR \
            --config n16 --mode "$mode" --json-out "$OUT/e2e_n16_${mode}_w${w}.json"
        done
      done
    fi
  else
    echo "no packed DB (no loongforge CLI in build-gpu/ or build/): trainer runs skipped"
  fi
elif has trainer || has e2e; then
  echo "loongforge.train is not importable here: trainer runs (b: n16/n16-moe, c: e2e) skipped"
fi

$PY bench/multigpu/summarize.py "$OUT" | tee "$OUT/summary_table.txt"
echo; echo "== summary =="; printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
