#!/usr/bin/env bash
# Generates and packs the end-to-end dataset once (33 episodes, 2 cameras, 640x480 q90) and prints
# its path. Used by common.sh (gpu_run.sh, ablation.sh, loss_curves.sh) and nan_probe.sh.
# $1 = the loongforge CLI.
set -euo pipefail
cli=${1:-${BUILD:-build-gpu}/loongforge}
db=${LF_E2E_DB:-/tmp/lf_e2e_db}
if [ ! -f "$db/data.mdb" ]; then
  "$cli" demo-data --out /tmp/lf_e2e_raw --episodes 33 --cameras 2 --size 640x480 >&2
  "$cli" pack --src /tmp/lf_e2e_raw --out "$db" --overwrite >&2
fi
echo "$db"
