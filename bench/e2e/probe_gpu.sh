set -uo pipefail
source bench/gpu_env.sh
gpu_build
PYTHONPATH=python timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rfs tests/python/test_graphs.py 2>&1 | tail -25
echo "tests $(( $(date +%s)-t0 )) s"
ROWS=${ROWS:-eager,syncfree,graphs} BATCHES=${BATCHES:-16} STEPS=${STEPS:-20} WARMUP=${WARMUP:-8} timeout ${ABL_T:-300} bash bench/e2e/ablation.sh $OUT 2>&1 | tail -30
echo "total $(( $(date +%s)-t0 )) s"
