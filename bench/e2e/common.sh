# Sourced (never run) by the e2e scripts that run inside a device call once build-gpu is built
# (gpu_run.sh, ablation.sh, loss_curves.sh): `source bench/e2e/common.sh OUTDIR` creates OUTDIR and
# sets out (OUTDIR), PY (python3 unless set) and db (the packed e2e dataset, made once by
# make_db.sh with ${BUILD:-build-gpu}/loongforge).
out=${1:?usage: source bench/e2e/common.sh OUTDIR}
mkdir -p "$out"
PY=${PY:-python3}
db=$(bash bench/e2e/make_db.sh "${BUILD:-build-gpu}/loongforge")
