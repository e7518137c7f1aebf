#!/usr/bin/env bash
# Generates and packs the end-to-end dataset once and prints its path: LF_E2E_SAMPLES samples
# (default 40,000: 625 batches per epoch at batch 64, 2,500 at 16, so an epoch boundary is a
# rare event as on a real dataset), 2 cameras, 640x480 JPEG q90 (about 4.8 GB). Episodes are
# 200 steps long; the count follows from the samples. Used by common.sh (gpu_run.sh,
# ablation.sh, loss_curves.sh), nan_probe.sh and the row scripts. $1 = the loongforge CLI.
set -euo pipefail
cli=${1:-${BUILD:-build-gpu}/loongforge}
samples=${LF_E2E_SAMPLES:-40000}
db=${LF_E2E_DB:-/tmp/lf_e2e_db_$samples}
if [ ! -f "$db/data.mdb" ]; then
  episodes=$(((samples + 199) / 200))
  t0=$(date +%s)
  "$cli" demo-data --out /tmp/lf_e2e_raw --episodes "$episodes" --cameras 2 --size 640x480 \
    --steps-min 200 --steps-max 200 --overwrite --quiet >&2
  "$cli" pack --src /tmp/lf_e2e_raw --out "$db" --overwrite >&2
  rm -rf /tmp/lf_e2e_raw
  echo "make_db: $samples samples in $db, $(($(date +%s) - t0)) s" >&2
fi
echo "$db"
